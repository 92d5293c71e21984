"""The client's self-audit read from real /proc/self/mountinfo content, checked against what
the kernel says by other means (statvfs's read-only flag, os.path.ismount, prctl's
no-new-privileges): this process's own mounts, and a process in its own mount namespace
(unshare) with a read-only root, a writable tmpfs at a path with a space (mountinfo escapes it
as \\040), a tmpfs mounted over again read-only, and no-new-privileges set (setpriv)."""

import ctypes
import json
import os
import subprocess
import sys

from fenceline_client import client as fl

PR_GET_NO_NEW_PRIVS = 39


def no_new_privs_of_this_process() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1


def read_only(path: str) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def test_this_process_mountinfo_reads_as_the_kernel_says():
    with open("/proc/self/mountinfo") as text:
        mountinfo = text.read()
    sensitive, writable, root_read_only = fl._mounts(mountinfo)
    assert root_read_only is read_only("/")
    assert writable, "a Linux process sees at least one writable mount (/dev/shm, a tmpfs, a volume)"
    for point in writable:
        assert os.path.ismount(point), point
        assert not read_only(point), point
    assert "/" not in writable and "/proc" not in writable  # the root is judged on its own; proc is pseudo
    audit = fl.runtime_audit()
    assert audit["no_new_privileges"] is no_new_privs_of_this_process()
    assert (audit["writable_mounts"], audit["read_only_root"]) == (writable, root_read_only)
    assert audit["sensitive_mounts"] == sensitive


AUDIT = (
    "import json; from fenceline_client import runtime_audit; "
    "print(json.dumps({'audit': runtime_audit(), 'mountinfo': open('/proc/self/mountinfo').read()}))"
)


def in_namespace(mounts: str) -> tuple[dict, str]:
    """(the self-audit, the raw mountinfo) of a Python process in a new mount namespace after
    ``mounts`` (shell), its root remounted read-only and no-new-privileges set by setpriv."""
    script = f'{mounts} mount -o remount,bind,ro / && exec setpriv --no-new-privs "{sys.executable}" -c "{AUDIT}"'
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    return seen["audit"], seen["mountinfo"]


def test_a_locked_down_mount_namespace_reads_as_read_only_root_no_new_privileges_and_one_output(tmp_path):
    output = tmp_path / "agent out"  # mountinfo writes it as agent\040out
    covered = tmp_path / "covered"
    output.mkdir()
    covered.mkdir()
    audit, mountinfo = in_namespace(
        f'mount -t tmpfs tmpfs "{output}" && mount -t tmpfs tmpfs "{covered}" && '
        f'mount --bind "{covered}" "{covered}" && mount -o remount,bind,ro "{covered}" &&'
    )
    assert str(output).replace(" ", "\\040") in mountinfo  # the kernel's escape, read back below
    assert audit["read_only_root"] is True
    assert audit["no_new_privileges"] is True
    assert str(output) in audit["writable_mounts"]
    assert str(covered) not in audit["writable_mounts"]  # mounted twice: its last mount is read-only
    assert "/" not in audit["writable_mounts"]
    assert fl._mounts(mountinfo)[1:] == (audit["writable_mounts"], True)


def test_the_namespace_audit_under_a_strict_policy_passes_only_with_the_output_declared(tmp_path):
    from ledger.policy import RUNTIME_AUDIT_RULES, runtime_audit_failures

    output = tmp_path / "out"
    output.mkdir()
    audit, _ = in_namespace(f'mount -t tmpfs tmpfs "{output}" &&')
    lenient = {**RUNTIME_AUDIT_RULES, "allow_root": True, "allowed_capabilities": audit["capabilities"]}
    lenient |= {"allow_host_control": True, "allow_sensitive_mounts": True}
    strict = {**lenient, "allow_writable_root": False, "allow_new_privileges": False}
    others = [m for m in audit["writable_mounts"] if m != str(output)]  # the host's own (/dev/shm ...)
    assert runtime_audit_failures({**strict, "output_paths": [str(output), *others]}, audit) == []
    undeclared = runtime_audit_failures({**strict, "output_paths": others}, audit)
    assert undeclared == [f"writable mounts outside the output paths: {output}"]
    # This test process itself: root writable and no no-new-privileges, as the kernel says.
    here = fl.runtime_audit()
    failures = runtime_audit_failures({**strict, "output_paths": None}, here)
    assert ("root filesystem writable" in failures) is (not read_only("/"))
    assert ("no-new-privileges not set" in failures) is (not no_new_privs_of_this_process())


def test_escaped_mount_points_read_back_as_the_paths_they_are():
    """Lines as the kernel writes them for a mount point with a space, a tab and a backslash."""
    mountinfo = (
        "46 45 254:0 / / ro,relatime - ext4 /dev/vda rw\n"
        "66 46 0:40 / /srv/agent\\040out rw,relatime - tmpfs tmpfs rw\n"
        "67 46 0:41 / /srv/a\\011b\\134c rw,relatime - tmpfs tmpfs rw\n"
        "68 46 0:42 / /home/dev\\040box ro,relatime - tmpfs tmpfs rw\n"
    )
    sensitive, writable, root_read_only = fl._mounts(mountinfo)
    assert root_read_only is True
    assert writable == ["/srv/agent out", "/srv/a\tb\\c"]
    assert sensitive == ["/ -> /home/dev box"]
