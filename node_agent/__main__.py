"""``python -m node_agent``: the node agent alone, without the rest of the ``meridian`` CLI.

The DaemonSet runs this entry point: ``meridian agent`` loads every component's commands (the
learned policies pull in torch, ~220 MB), which a per-node agent with a 160 MiB limit cannot afford.
"""

from __future__ import annotations

import logging

import typer

from node_agent.cli import agent


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    typer.run(agent)


if __name__ == "__main__":
    main()
