"""The list-and-watch informer: resume from the last resourceVersion (events and bookmarks), relist on
``410 Gone``, back off on errors. The resume and the events run against a real API server; the API
server cannot be made to compact its history on demand, so ``410`` comes from a recorded stream."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes import client

from meridian.envtest import wait_for
from regional_scheduler.informer import Informer


class Recorder:
    def __init__(self) -> None:
        self.relists: list[list[dict[str, Any]]] = []
        self.events: list[tuple[str, str]] = []

    def relisted(self, items: list[dict[str, Any]]) -> None:
        self.relists.append(items)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append((kind, obj["metadata"]["name"]))


class _Response:
    """A urllib3-like response: ``data`` for a list, ``stream`` lines for a watch."""

    def __init__(self, *, data: dict[str, Any] | None = None, lines: list[dict[str, Any]] | None = None) -> None:
        self.data = json.dumps(data or {}).encode()
        self._lines = [json.dumps(line).encode() + b"\n" for line in lines or []]

    def stream(self, amt: int = 0, decode_content: bool = True) -> Any:
        yield from self._lines

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


def _pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class ScriptedApi:
    """Answers list and watch calls from a script, recording the resourceVersion each watch asked for."""

    def __init__(self, script: list[_Response]) -> None:
        self.script = script
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> _Response:
        self.calls.append(kwargs)
        if not self.script:
            raise ConnectionError("end of script")
        return self.script.pop(0)


def test_a_watch_resumes_from_the_last_version_and_410_relists() -> None:
    api = ScriptedApi([
        _Response(data={"items": [_pod("a", "5")], "metadata": {"resourceVersion": "10"}}),
        _Response(lines=[{"type": "ADDED", "object": _pod("b", "11")},
                         {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}]),
        _Response(lines=[{"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old"}}]),
        _Response(data={"items": [_pod("a", "5"), _pod("b", "11"), _pod("c", "20")],
                        "metadata": {"resourceVersion": "21"}}),
        _Response(lines=[{"type": "DELETED", "object": _pod("a", "22")}]),
    ])
    recorder = Recorder()
    stop = threading.Event()
    informer = Informer(name="pods", list_fn=api, handler=recorder, backoff_s=(0.01,))
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    wait_for(lambda: len(api.calls) >= 6, timeout=10, message="the script played")
    stop.set()
    thread.join(timeout=5)
    watches = [c for c in api.calls if c.get("watch")]
    # first watch from the list's version, second from the bookmark's, third from the relist's
    assert [w["resource_version"] for w in watches[:3]] == ["10", "15", "21"]
    assert all(w["allow_watch_bookmarks"] for w in watches)
    assert [len(items) for items in recorder.relists] == [1, 3]  # the relist hands over the whole set
    assert recorder.events == [("ADDED", "b"), ("DELETED", "a")]  # bookmarks are not events
    assert informer.relists == 2


def test_a_paginated_list_is_read_to_the_end() -> None:
    api = ScriptedApi([
        _Response(data={"items": [_pod("a", "1")], "metadata": {"continue": "tok"}}),
        _Response(data={"items": [_pod("b", "2")], "metadata": {"resourceVersion": "3"}}),
    ])
    recorder = Recorder()
    informer = Informer(name="pods", list_fn=api, handler=recorder, page_size=1)
    informer.list()
    assert [i["metadata"]["name"] for i in recorder.relists[0]] == ["a", "b"]
    assert api.calls[1]["_continue"] == "tok" and informer.resource_version == "3"


@pytest.mark.kubernetes
def test_watches_that_end_are_resumed_without_losing_events(kube_api: client.ApiClient, kube_namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    recorder = Recorder()
    stop = threading.Event()
    informer = Informer(name="configmaps",
                        list_fn=lambda **kw: core.list_namespaced_config_map(kube_namespace, **kw),
                        handler=recorder, watch_timeout_s=1)  # the server ends each watch after ~1 s
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert informer.synced.wait(10)
        for i in range(6):
            core.create_namespaced_config_map(kube_namespace, {"metadata": {"name": f"cm{i}"}})
            wait_for(lambda i=i: ("ADDED", f"cm{i}") in recorder.events, timeout=10, message=f"cm{i} seen")
            if i in (1, 3):  # the creations spread over several watch requests: one ends and is resumed
                resumed = informer.resumes
                wait_for(lambda resumed=resumed: informer.resumes > resumed, timeout=30,
                         message="the watch to end and be resumed")
        assert informer.resumes >= 1 and informer.relists == 1
        # each exactly once, in order: a resumed watch neither misses nor repeats an event
        ours = [e for e in recorder.events if e[1].startswith("cm")]
        assert ours == [("ADDED", f"cm{i}") for i in range(6)]
    finally:
        stop.set()
        thread.join(timeout=5)
