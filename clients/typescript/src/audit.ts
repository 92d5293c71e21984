/**
 * The container self-audit (article "Your Agent Container Is Not Isolated Until You Test the
 * Mounts"), as the Python client's `runtime_audit` makes it: what this process can reach,
 * checked from inside, sent as the boot report's `readiness.runtime.evidence.audit`. Paths
 * only, no contents; the judgement is the server's (the tenant policy's `runtime_audit`).
 */
import { accessSync, constants, readFileSync, statSync } from "node:fs";
import { join } from "node:path";

// Linux capability numbers 0..40, in order (linux/capability.h).
const CAPABILITIES = [
  "chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
  "linux_immutable", "net_bind_service", "net_broadcast", "net_admin", "net_raw", "ipc_lock", "ipc_owner",
  "sys_module", "sys_rawio", "sys_chroot", "sys_ptrace", "sys_pacct", "sys_admin", "sys_boot", "sys_nice",
  "sys_resource", "sys_time", "sys_tty_config", "mknod", "lease", "audit_write", "audit_control", "setfcap",
  "mac_override", "mac_admin", "syslog", "wake_alarm", "block_suspend", "audit_read", "perfmon", "bpf",
  "checkpoint_restore",
];
// Paths that give control of the host when reachable from inside, and what makes them so.
const HOST_CONTROL: [string, "socket" | "dir" | "readable"][] = [
  ["var/run/docker.sock", "socket"],
  ["run/docker.sock", "socket"],
  ["run/containerd/containerd.sock", "socket"],
  ["root/.ssh", "dir"],
  ["proc/1/root/etc/shadow", "readable"],
];
const SENSITIVE_SOURCES = ["/home", "/root", "/etc", "/var/run/docker.sock", "/run/docker.sock", "/var/lib/docker"];
const SENSITIVE_NAMES = [".ssh", ".aws", ".kube", ".docker", ".gnupg"];
const PSEUDO_FILESYSTEMS = new Set([
  "proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "devtmpfs", "securityfs", "debugfs", "tracefs",
  "pstore", "bpf", "hugetlbfs", "fusectl", "configfs", "binfmt_misc", "autofs", "nsfs",
]);
const MAX_LISTED = 16; // the evidence of a boot stays small (the server caps it at 4 KiB)

export type RuntimeAudit = {
  uid: number | null;
  capabilities: string[] | null;
  no_new_privileges: boolean;
  read_only_root: boolean;
  writable_mounts: string[];
  sensitive_mounts: string[];
  host_control: string[];
};

function readOrEmpty(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

function capabilities(hexMask: string): string[] {
  const mask = BigInt(`0x${hexMask.trim()}`);
  return CAPABILITIES.filter((_, bit) => (mask >> BigInt(bit)) & 1n);
}

function hostControl(root: string): string[] {
  const found: string[] = [];
  for (const [path, kind] of HOST_CONTROL) {
    const full = join(root, path);
    try {
      const stat = statSync(full);
      if (kind === "socket" ? stat.isSocket() : kind === "dir" ? stat.isDirectory() : readable(full)) {
        found.push(`/${path}`);
      }
    } catch {
      // not there, or not reachable
    }
  }
  return found;
}

function readable(path: string): boolean {
  try {
    accessSync(path, constants.R_OK);
    return true;
  } catch {
    return false;
  }
}

/** A path as mountinfo writes it (space, tab, newline and backslash as octal escapes), read back. */
function unescaped(path: string): string {
  return path.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
}

function reaches(paths: string[]): boolean {
  return (
    paths.some((p) => SENSITIVE_SOURCES.some((s) => p === s || p.startsWith(`${s}/`))) ||
    paths.some((p) => SENSITIVE_NAMES.some((name) => p.split("/").includes(name)))
  );
}

/**
 * (sensitive mounts, writable mounts, root read-only) from /proc/self/mountinfo lines; a mount
 * point mounted over again counts as its last mount (the one this process sees).
 */
function mounts(mountinfo: string): [string[], string[], boolean] {
  const seen = new Map<string, [string, string[], string]>(); // point -> (source root, options, fstype)
  for (const line of mountinfo.split("\n")) {
    const fields = line.trim().split(/\s+/);
    if (!line.includes(" - ") || fields.length < 6) continue;
    const point = unescaped(fields[4] ?? "");
    seen.delete(point); // mounted over: listed again in its new place, last
    const fstype = line.split(" - ", 2)[1]?.trim().split(/\s+/)[0] ?? "";
    seen.set(point, [unescaped(fields[3] ?? ""), (fields[5] ?? "").split(","), fstype]);
  }
  const sensitive: string[] = [];
  const writable: string[] = [];
  for (const [point, [sourceRoot, options, fstype]] of seen) {
    if (PSEUDO_FILESYSTEMS.has(fstype)) continue;
    if (options.includes("rw") && point !== "/") writable.push(point);
    if (reaches([sourceRoot, point])) sensitive.push(sourceRoot !== point ? `${sourceRoot} -> ${point}` : point);
  }
  const root = seen.get("/");
  return [sensitive.slice(0, MAX_LISTED), writable.slice(0, MAX_LISTED), root !== undefined && root[1].includes("ro")];
}

/** What this process can reach, checked from inside: the same fields as the Python client's. */
export function runtimeAudit(where: { proc?: string; root?: string } = {}): RuntimeAudit {
  const proc = where.proc ?? "/proc";
  const status = new Map<string, string>();
  for (const line of readOrEmpty(join(proc, "self/status")).split("\n")) {
    const at = line.indexOf(":\t");
    if (at >= 0) status.set(line.slice(0, at), line.slice(at + 2));
  }
  const [sensitive, writable, readOnlyRoot] = mounts(readOrEmpty(join(proc, "self/mountinfo")));
  const uid = (status.get("Uid") ?? "").trim().split(/\s+/);
  const capEff = status.get("CapEff");
  return {
    uid: uid.length > 1 ? Number(uid[1]) : null, // the effective user id
    capabilities: capEff !== undefined ? capabilities(capEff) : null,
    no_new_privileges: (status.get("NoNewPrivs") ?? "").trim() === "1",
    read_only_root: readOnlyRoot,
    writable_mounts: writable,
    sensitive_mounts: sensitive,
    host_control: hostControl(where.root ?? "/"),
  };
}
