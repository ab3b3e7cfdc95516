"""The sandbox's system-call filter (harness.runner.sandbox): a seccomp BPF program, built here with
`struct` and installed with prctl through ctypes, so it needs no library.

It refuses (EPERM) what would let code under test reach another process or leave its namespaces:
ptrace, process_vm_readv/writev and pidfd_getfd (another process's memory or descriptors), unshare,
setns and a clone into new namespaces (a new user namespace gives back every capability), and the
mount calls (the read-only binds stay read-only). clone3 answers ENOSYS, as container runtimes do:
its flags sit in memory a filter cannot read, and the C library then falls back to clone.
"""

from __future__ import annotations

import ctypes
import platform
import struct

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
EPERM, ENOSYS = 1, 38

# x86_64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
CLONE, CLONE3 = 56, 435
REFUSED = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
    "unshare": 272, "setns": 308,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
}
# CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NAMESPACES = 0x80 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Classic BPF opcodes.
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0_LOW = 0, 4, 16


def unsupported() -> str | None:
    """Why this machine gets no filter from here, or None."""
    if platform.machine() != "x86_64":
        return f"the system-call filter knows x86_64's call numbers only, not {platform.machine()}'s"
    return None


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program() -> bytes:
    """The filter, as `struct sock_filter` entries."""
    refused = sorted(REFUSED.values())
    ops = [_op(_LD_W_ABS, _ARCH), _op(_JEQ_K, AUDIT_ARCH_X86_64, 1, 0), _op(_RET_K, _RET_KILL_PROCESS),
           _op(_LD_W_ABS, _NR)]
    # The checks below jump to one of three returns at the end: deny (EPERM), ENOSYS, allow.
    checks = [(_JGE_K, X32_SYSCALL_BIT, "deny"), *((_JEQ_K, nr, "deny") for nr in refused),
              (_JEQ_K, CLONE3, "nosys"), (_JEQ_K, CLONE, "clone")]
    after_checks = len(checks)
    # Layout after the checks: [allow-jump] [clone: load arg0, jset] [allow] [deny] [nosys]
    clone_at, allow_at = after_checks + 1, after_checks + 3
    deny_at, nosys_at = allow_at + 1, allow_at + 2
    for index, (code, k, where) in enumerate(checks):
        to = {"deny": deny_at, "nosys": nosys_at, "clone": clone_at}[where]
        ops.append(_op(code, k, to - index - 1, 0))
    ops.append(_op(0x05, allow_at - after_checks - 1))  # BPF_JMP|BPF_JA: nothing matched
    ops.append(_op(_LD_W_ABS, _ARG0_LOW))  # clone's flags (their low 32 bits hold every namespace flag)
    ops.append(_op(_JSET_K, CLONE_NAMESPACES, 1, 0))  # set: deny; else allow
    ops += [_op(_RET_K, _RET_ALLOW), _op(_RET_K, _RET_ERRNO | EPERM), _op(_RET_K, _RET_ERRNO | ENOSYS)]
    return b"".join(ops)


def install() -> None:
    """no_new_privs, then the filter, for this thread and what it starts (a single-threaded process:
    the sandbox installs it before the code under test starts a thread). Raises OSError."""
    libc = ctypes.CDLL(None, use_errno=True)
    code = program()
    filters = ctypes.create_string_buffer(code, len(code))

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Prog(len(code) // 8, ctypes.addressof(filters))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
