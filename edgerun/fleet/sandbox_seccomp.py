"""A seccomp filter for bubblewrap runs, compiled by libseccomp (the library Flatpak and container runtimes use).

It refuses (EPERM) the system calls that a Python task never needs and that widen the kernel's attack
surface or reach state namespaces do not isolate: the kernel keyring, kernel modules and kexec, eBPF and
perf events, `open_by_handle_at` (a classic container escape), new user namespaces (`clone`/`unshare`
with CLONE_NEWUSER; `clone3` answers ENOSYS so the C library falls back to `clone`), io_uring,
userfaultfd, `ptrace`, accounting, swap, quotas, reboot and the raw I/O port calls. Everything else is
allowed. Where libseccomp is missing the runs go on without the filter and `seccomp_filter()` is None.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from functools import lru_cache

_ACT_ALLOW = 0x7FFF0000
_CMP_MASKED_EQ = 7
_CLONE_NEWUSER = 0x10000000

DENIED = (
    "add_key", "keyctl", "request_key", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "bpf", "perf_event_open", "open_by_handle_at", "name_to_handle_at", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "userfaultfd", "ptrace", "process_vm_readv", "process_vm_writev",
    "acct", "swapon", "swapoff", "quotactl", "reboot", "syslog", "ioperm", "iopl", "mount", "umount2",
    "pivot_root", "setns", "lookup_dcookie", "vhangup", "personality", "fanotify_init", "move_mount",
    "open_tree", "fsopen", "fsmount", "fspick",
)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


@lru_cache(maxsize=1)
def seccomp_filter() -> bytes | None:
    """The compiled BPF program for bubblewrap's `--seccomp FD`, or None without libseccomp (built once)."""
    name = ctypes.util.find_library("seccomp")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        return None
    try:
        def deny(syscall: str, code: int = errno.EPERM, arg: _ArgCmp | None = None) -> None:
            number = lib.seccomp_syscall_resolve_name(syscall.encode())
            if number < 0:
                return  # not on this architecture
            args = (_ArgCmp * 1)(arg) if arg is not None else None
            if lib.seccomp_rule_add_array(ctx, _errno_action(code), number, 1 if arg else 0, args) != 0:
                raise OSError(f"libseccomp refused a rule for {syscall}")

        for syscall in DENIED:
            deny(syscall)
        deny("clone3", errno.ENOSYS)
        for syscall in ("clone", "unshare"):  # flags are the first argument of both on x86-64 and arm64
            deny(syscall, arg=_ArgCmp(0, _CMP_MASKED_EQ, _CLONE_NEWUSER, _CLONE_NEWUSER))
        fd = os.memfd_create("edgerun-seccomp-build", 0)
        try:
            if lib.seccomp_export_bpf(ctx, fd) != 0:
                return None
            size = os.lseek(fd, 0, os.SEEK_CUR)
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    except OSError:
        return None
    finally:
        lib.seccomp_release(ctx)


def filter_fd() -> int | None:
    """A fresh readable descriptor holding the filter (bubblewrap reads it once), or None."""
    program = seccomp_filter()
    if program is None:
        return None
    fd = os.memfd_create("edgerun-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
