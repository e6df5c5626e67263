"""A seccomp-BPF filter for the sandbox, handed to bwrap with `--seccomp FD`.

Defence in depth on top of the namespaces: untrusted contest code never needs to mount, trace, load
modules, make namespaces, use io_uring (which bypasses seccomp), read other processes' memory or make
SysV/POSIX IPC objects (which would outlive a test inside a reused sandbox). Those calls fail with EPERM;
`clone3` fails with ENOSYS so that libc falls back to `clone`, whose flags a classic filter can inspect.
Syscalls of another ABI on the same machine (i386 on x86_64) kill the process.

Refused by argument as well (issue 28):
- `clone` with CLONE_PARENT: a child of the sample's parent (the zygote) is not the sample's descendant, and would
  outlive it as a zombie of the zygote.
- `socket`/`socketpair` of any family but AF_UNIX (EAFNOSUPPORT): namespaces do not cover every family (AF_VSOCK
  reaches a virtual machine's host; netlink, packet and the rest are never needed by a test program). With no
  network namespace peer, AF_INET would only ever reach the sandbox's own loopback: no task needs it.
- State shared with samples judged beside or after it, through files every sandbox sees read-only: `flock`,
  `fcntl` record/OFD locks, leases and directory notifications (F_NOTIFY), `inotify_*`, `fanotify_*`; and probes
  of the page cache of those files: `cachestat`, `preadv2`/`pwritev2` with RWF_NOWAIT. See docs/sandbox.md.
"""
from __future__ import annotations

import platform
import struct

# linux/filter.h and linux/seccomp.h
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO, _KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_EPERM, _ENOSYS, _EAFNOSUPPORT = 1, 38, 97
_ARCH_OFFSET, _NR_OFFSET, _ARGS_OFFSET = 4, 0, 16  # fields of struct seccomp_data (args: 8 bytes each, low word)
# CLONE_NEWTIME | NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_NEW_NAMESPACE_FLAGS = (0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                        | 0x40000000)
_CLONE_PARENT = 0x00008000
_AF_UNIX = 1
# fcntl commands: F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY
_SHARED_STATE_FCNTL = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)
_RWF_NOWAIT = 0x00000008
_X32_SYSCALL_BIT = 0x40000000

# audit arch, {refused syscall: number}, {syscall checked by argument: number}
# -- numbers from asm/unistd_64.h and asm-generic/unistd.h
_X86_64 = (0xC000003E, dict(
    ptrace=101, mount=165, umount2=166, swapon=167, swapoff=168, reboot=169, kexec_load=246, kexec_file_load=320,
    init_module=175, finit_module=313, delete_module=176, unshare=272, setns=308, pivot_root=155, chroot=161,
    acct=163, keyctl=250, add_key=248, request_key=249, bpf=321, perf_event_open=298, userfaultfd=323,
    open_by_handle_at=304, name_to_handle_at=303, io_uring_setup=425, io_uring_enter=426, io_uring_register=427,
    process_vm_readv=310, process_vm_writev=311, open_tree=428, move_mount=429, fsopen=430, fsconfig=431,
    fsmount=432, fspick=433, mount_setattr=442, syslog=103, quotactl=179, shmget=29, semget=64, msgget=68,
    mq_open=240, vhangup=153, fanotify_init=300, iopl=172, ioperm=173, uselib=134, lookup_dcookie=212,
    fanotify_mark=301, flock=73, inotify_init=253, inotify_init1=294, inotify_add_watch=254, cachestat=451,
), dict(clone=56, clone3=435, socket=41, socketpair=53, fcntl=72, preadv2=327, pwritev2=328))
_AARCH64 = (0xC00000B7, dict(
    ptrace=117, mount=40, umount2=39, swapon=224, swapoff=225, reboot=142, kexec_load=104, kexec_file_load=294,
    init_module=105, finit_module=273, delete_module=106, unshare=97, setns=268, pivot_root=41, chroot=51,
    acct=89, keyctl=219, add_key=217, request_key=218, bpf=280, perf_event_open=241, userfaultfd=282,
    open_by_handle_at=265, name_to_handle_at=264, io_uring_setup=425, io_uring_enter=426, io_uring_register=427,
    process_vm_readv=270, process_vm_writev=271, open_tree=428, move_mount=429, fsopen=430, fsconfig=431,
    fsmount=432, fspick=433, mount_setattr=442, syslog=116, quotactl=60, shmget=194, semget=190, msgget=186,
    mq_open=180, vhangup=58, fanotify_init=262,
    fanotify_mark=263, flock=32, inotify_init1=26, inotify_add_watch=27, cachestat=451,
), dict(clone=220, clone3=435, socket=198, socketpair=199, fcntl=25, preadv2=286, pwritev2=287))
_ARCHES = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter as a raw `struct sock_filter[]`, or None on a machine without a syscall table here."""
    machine = (machine or platform.machine()).lower()
    if machine not in _ARCHES:
        return None
    audit_arch, refused, checked = _ARCHES[machine]
    program = [
        (_LD_W_ABS, 0, 0, _ARCH_OFFSET),
        (_JEQ_K, 1, 0, audit_arch),
        (_RET_K, 0, 0, _KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _NR_OFFSET),
    ]
    if audit_arch == _X86_64[0]:
        program += [(_JGE_K, 0, 1, _X32_SYSCALL_BIT), (_RET_K, 0, 0, _ERRNO | _EPERM)]
    for number in sorted(refused.values()):
        program += [(_JEQ_K, 0, 1, number), (_RET_K, 0, 0, _ERRNO | _EPERM)]
    program += [(_JEQ_K, 0, 1, checked["clone3"]), (_RET_K, 0, 0, _ERRNO | _ENOSYS)]
    program += _by_argument(checked["clone"], 0, [(_JSET_K, _NEW_NAMESPACE_FLAGS | _CLONE_PARENT, _EPERM)])
    for name in ("socket", "socketpair"):
        program += _by_argument(checked[name], 0, [(_JEQ_K, _AF_UNIX, None)], otherwise=_EAFNOSUPPORT)
    program += _by_argument(checked["fcntl"], 1, [(_JEQ_K, command, _EPERM) for command in _SHARED_STATE_FCNTL])
    for name in ("preadv2", "pwritev2"):
        program += _by_argument(checked[name], 5, [(_JSET_K, _RWF_NOWAIT, _EPERM)])
    program.append((_RET_K, 0, 0, _ALLOW))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def _by_argument(number: int, arg: int, tests: list[tuple[int, int, int | None]], otherwise: int | None = None) -> list:
    """Instructions for syscall `number` (the accumulator holds the syscall number): load argument `arg`, and on the
    first test (JEQ/JSET against a constant) that matches return its errno (None: allow); if none matches, return
    `otherwise` (None: allow). Every other syscall jumps past the block with the accumulator untouched."""
    block = [(_LD_W_ABS, 0, 0, _ARGS_OFFSET + 8 * arg)]
    for op, constant, errno in tests:
        block += [(op, 0, 1, constant), (_RET_K, 0, 0, _ALLOW if errno is None else _ERRNO | errno)]
    block.append((_RET_K, 0, 0, _ALLOW if otherwise is None else _ERRNO | otherwise))
    return [(_JEQ_K, 0, len(block), number)] + block
