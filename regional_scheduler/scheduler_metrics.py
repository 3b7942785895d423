"""The regional scheduler's Prometheus metrics, named as kube-scheduler's where they mean the same, so
dashboards and alerts written for kube-scheduler work unchanged (``profile`` is the scheduler name)."""

from __future__ import annotations

from meridian import observability as obs

# kube-scheduler's own buckets for scheduling durations (exponential from 1 ms).
SCHEDULING_BUCKETS_S = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
                        8.192, 16.384)

PENDING_PODS = obs.gauge("scheduler_pending_pods", "Pending pods by queue: active, backoff, unschedulable (gated "
                         "holds pods Meridian refuses, until they change).", ["queue"])
SCHEDULE_ATTEMPTS = obs.counter("scheduler_schedule_attempts_total", "Scheduling attempts by result: scheduled, "
                                "unschedulable, error.", ["result", "profile"])
E2E_DURATION = obs.histogram("scheduler_e2e_scheduling_duration_seconds", "From the start of a scheduling attempt "
                             "to the binding (or the failure), by result.", ["result", "profile"],
                             buckets=SCHEDULING_BUCKETS_S)
ATTEMPT_DURATION = obs.histogram("scheduler_scheduling_attempt_duration_seconds", "Scheduling algorithm time of "
                                 "one attempt (filter, score, select), by result.", ["result", "profile"],
                                 buckets=SCHEDULING_BUCKETS_S)
EXTENSION_POINT_DURATION = obs.histogram("scheduler_framework_extension_point_duration_seconds", "Time in each "
                                         "stage (Filter, Score, Bind).", ["extension_point", "status", "profile"],
                                         buckets=SCHEDULING_BUCKETS_S)
POD_SCHEDULING_SLI = obs.histogram("scheduler_pod_scheduling_sli_duration_seconds", "From a pod entering the "
                                   "queue to its binding, across attempts.", ["attempts"],
                                   buckets=SCHEDULING_BUCKETS_S)
IS_LEADER = obs.gauge("meridian_regional_scheduler_leader", "1 while this replica holds the leader Lease.",
                      ["cluster"])
BIND_CONFLICTS = obs.counter("meridian_regional_bind_conflicts_total", "Bindings answered 409 Conflict (the pod "
                             "was bound already): reconciled from the pod informer, never retried.", ["cluster"])
