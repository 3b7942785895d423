"""The fault suite's rig: a private Redis and real component processes per test, all stopped afterwards
(their logs are printed at teardown, which pytest shows for a failed test)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.faults.harness import Component, Redis, SchedulerProcess, dispatch_worker


@dataclass
class Rig:
    tmp: Path
    components: list[Component] = field(default_factory=list)
    servers: list[Redis] = field(default_factory=list)

    def redis(self, *, appendonly: bool = False) -> Redis:
        workdir = self.tmp / f"redis-{len(self.servers)}"
        workdir.mkdir()
        server = Redis(workdir, appendonly=appendonly)
        server.start()
        self.servers.append(server)
        return server

    def scheduler(self, redis: Redis, *, start: bool = True, **kwargs: object) -> SchedulerProcess:
        proc = SchedulerProcess(redis_url=redis.url, log=self.tmp / "global-scheduler.log", **kwargs)  # type: ignore[arg-type]
        self.components.append(proc)
        if start:
            proc.start()
        return proc

    def worker(self, cluster: str, redis_url: str, *, node_offset: int, start: bool = True,
               **kwargs: object) -> Component:
        proc = dispatch_worker(cluster=cluster, redis_url=redis_url, log=self.tmp / f"dispatch-{cluster}.log",
                               node_offset=node_offset, **kwargs)  # type: ignore[arg-type]
        self.components.append(proc)
        if start:
            proc.start()
        return proc


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    for component in made.components:
        component.kill()
    for server in made.servers:
        server.kill()
    for log in sorted(tmp_path.glob("*.log")):
        print(f"---- {log.name} (last 4000 characters)\n{log.read_text(errors='replace')[-4000:]}")
