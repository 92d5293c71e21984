"""The client's container self-audit read from a fake /proc and root: the effective user
id, capabilities decoded from CapEff, sensitive and writable mounts from mountinfo, and
host-control paths (a docker socket, root's .ssh)."""

import socket

from fenceline_client import client as fl

MOUNTINFO = """\
22 1 0:21 / / ro,relatime - overlay overlay rw,lowerdir=/l
23 22 0:22 / /proc rw,nosuid - proc proc rw
24 22 8:1 /srv/agent-workspace /workspace rw,relatime - ext4 /dev/sda1 rw
25 22 8:1 /home/dev/.ssh /agent/keys ro,relatime - ext4 /dev/sda1 rw
26 22 8:1 /home/dev /mnt/home rw,relatime - ext4 /dev/sda1 rw
27 22 0:23 / /scratch rw,nosuid - tmpfs tmpfs rw
"""


def fake_host(tmp_path, *, uid: int, cap_eff: str, docker_socket: bool):
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "status").write_text(
        f"Name:\tworker\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nCapEff:\t{cap_eff}\nNoNewPrivs:\t1\n"
    )
    (proc / "mountinfo").write_text(MOUNTINFO)
    root = tmp_path / "root"
    (root / "root" / ".ssh").mkdir(parents=True)
    if docker_socket:
        (root / "var" / "run").mkdir(parents=True)
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(root / "var" / "run" / "docker.sock"))
        listener.close()
    return str(tmp_path / "proc"), str(root)


def test_a_root_process_with_capabilities_and_a_docker_socket_shows_all_three(tmp_path):
    proc, root = fake_host(tmp_path, uid=0, cap_eff="0000000000200001", docker_socket=True)  # bits 0, 21
    audit = fl.runtime_audit(proc=proc, root=root)
    assert audit["uid"] == 0
    assert audit["capabilities"] == ["chown", "sys_admin"]
    assert audit["host_control"] == ["/var/run/docker.sock", "/root/.ssh"]
    assert audit["sensitive_mounts"] == ["/home/dev/.ssh -> /agent/keys", "/home/dev -> /mnt/home"]
    assert audit["writable_mounts"] == ["/workspace", "/mnt/home", "/scratch"]  # proc is not a mount to audit
    assert audit["read_only_root"] is True and audit["no_new_privileges"] is True


def test_a_locked_down_process_reports_no_capabilities_and_no_socket(tmp_path):
    proc, root = fake_host(tmp_path, uid=10001, cap_eff="0000000000000000", docker_socket=False)
    audit = fl.runtime_audit(proc=proc, root=root)
    assert (audit["uid"], audit["capabilities"]) == (10001, [])
    assert audit["host_control"] == ["/root/.ssh"]


def test_without_a_proc_filesystem_the_audit_reports_nothing_rather_than_guessing(tmp_path):
    audit = fl.runtime_audit(proc=str(tmp_path / "absent"), root=str(tmp_path))
    assert audit["uid"] is None and audit["capabilities"] is None
    assert audit["sensitive_mounts"] == [] and audit["host_control"] == []
