"""`make run`'s local AWS: Procfile.dev starts moto's server on the port that AWS_ENDPOINT_URL
names by default, and run_dev refuses to start while something else answers there."""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

from agents.aws import client
from agents.registry import AwsSettings
from tests.conftest import ROOT, _free_port, _port_answers, _serve


def procfile_command(name: str) -> list[str]:
    lines = (ROOT / "Procfile.dev").read_text().splitlines()
    [line] = [line for line in lines if line.startswith(f"{name}:")]
    return shlex.split(line.partition(":")[2])


def test_make_runs_moto_where_the_settings_send_the_agents(tmp_path: Path) -> None:
    command = procfile_command("aws")
    assert command[:3] == ["python", "-m", "moto.server"]
    port = command[command.index("-p") + 1]
    settings = (ROOT / "stateguard_web" / "settings.py").read_text()
    assert f'else "http://127.0.0.1:{port}")' in settings  # AWS_ENDPOINT_URL's default
    assert f"AWS_ENDPOINT_URL=http://127.0.0.1:{port}" in (ROOT / ".env.example").read_text()
    assert f'{port}: "aws (moto)"' in (ROOT / "tools" / "run_dev.py").read_text()

    # The command itself, on a free port: an AWS API the agents' clients talk to.
    free = _free_port()
    argv = [sys.executable, *command[1:command.index("-p") + 1], str(free)]
    server = _serve(argv, "moto", free, tmp_path)
    url = next(server)
    try:
        ec2 = client(AwsSettings(region="us-east-1", endpoint_url=url, access_key_id="testing",
                                 secret_access_key="testing"), "ec2")
        assert ec2.describe_instances()["Reservations"] == []
    finally:
        server.close()


def test_make_run_refuses_to_start_while_the_aws_port_is_taken() -> None:
    # Another checkout's moto would mix that stack's servers into this one's. A database that
    # cannot be reached, so that a run_dev that did not refuse stops at its migration.
    env = {**os.environ, "STATEGUARD_ENV_FILE": "",
           "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}
    with contextlib.ExitStack() as stack:
        if not _port_answers("127.0.0.1", 8430):  # else something listens there already
            taken = stack.enter_context(socket.socket())
            taken.bind(("127.0.0.1", 8430))
            taken.listen()
        result = subprocess.run([sys.executable, str(ROOT / "tools" / "run_dev.py")], env=env,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "8430 (aws (moto))" in result.stderr
