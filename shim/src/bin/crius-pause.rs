//! crius-pause: the infra process of a pod.
//!
//! It holds the pod's namespaces, and as PID 1 of a pod that shares one PID namespace it reaps
//! every orphan that ends up as its child. It exits 0 on SIGINT or SIGTERM.
//!
//! The program talks to the kernel through raw system calls only, so the same source builds
//! two ways: as an ordinary cargo binary (dynamically linked, handy on the host), and, from
//! `build.rs` with `--cfg static_pause`, as a `no_std` static executable of a few KiB that runs
//! from a read-only bind mount in an empty rootfs (no loader, no libc there). `crius-shim
//! --install-pause <path>` writes that static build out.
#![cfg_attr(static_pause, no_std)]
#![cfg_attr(static_pause, no_main)]

#[cfg(target_arch = "x86_64")]
mod nr {
    pub const RT_SIGPROCMASK: usize = 14;
    pub const RT_SIGTIMEDWAIT: usize = 128;
    pub const WAIT4: usize = 61;
    pub const EXIT_GROUP: usize = 231;
}

#[cfg(target_arch = "aarch64")]
mod nr {
    pub const RT_SIGPROCMASK: usize = 135;
    pub const RT_SIGTIMEDWAIT: usize = 137;
    pub const WAIT4: usize = 260;
    pub const EXIT_GROUP: usize = 94;
}

const SIGINT: usize = 2;
const SIGTERM: usize = 15;
const SIGCHLD: usize = 17;
const SIG_BLOCK: usize = 0;
const WNOHANG: usize = 1;
/// `__WALL`: also reap children whose exit signal is not SIGCHLD.
const WALL: usize = 0x4000_0000;

/// # Safety
/// The caller passes arguments valid for system call `n`.
#[cfg(target_arch = "x86_64")]
unsafe fn syscall4(n: usize, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: the Linux x86_64 system call convention; rcx and r11 are clobbered by `syscall`.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a, in("rsi") b, in("rdx") c, in("r10") d,
            lateout("rcx") _, lateout("r11") _,
            options(nostack)
        );
    }
    ret
}

/// # Safety
/// The caller passes arguments valid for system call `n`.
#[cfg(target_arch = "aarch64")]
unsafe fn syscall4(n: usize, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: the Linux aarch64 system call convention (number in x8, result in x0).
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") a as isize => ret,
            in("x1") b, in("x2") c, in("x3") d,
            options(nostack)
        );
    }
    ret
}

fn exit(code: usize) -> ! {
    loop {
        // SAFETY: exit_group takes a plain integer and does not return.
        unsafe { syscall4(nr::EXIT_GROUP, code, 0, 0, 0) };
    }
}

/// Reap every child that has exited; never blocks.
fn reap() {
    loop {
        let mut status: i32 = 0;
        // SAFETY: wait4(-1, &status, WNOHANG|__WALL, NULL) writes only into `status`.
        let pid = unsafe {
            syscall4(
                nr::WAIT4,
                usize::MAX, // -1: any child
                &mut status as *mut i32 as usize,
                WNOHANG | WALL,
                0,
            )
        };
        if pid <= 0 {
            return;
        }
    }
}

fn run() -> ! {
    let mask: u64 = (1 << (SIGINT - 1)) | (1 << (SIGTERM - 1)) | (1 << (SIGCHLD - 1));
    // SAFETY: rt_sigprocmask reads the 8-byte mask we pass and writes nothing (old set NULL).
    let ret = unsafe {
        syscall4(
            nr::RT_SIGPROCMASK,
            SIG_BLOCK,
            &mask as *const u64 as usize,
            0,
            8,
        )
    };
    if ret < 0 {
        exit(1);
    }
    // Orphans may have been handed to us before the mask was set.
    reap();
    loop {
        // SAFETY: rt_sigtimedwait with a NULL siginfo and NULL timeout only reads `mask`.
        let sig = unsafe { syscall4(nr::RT_SIGTIMEDWAIT, &mask as *const u64 as usize, 0, 0, 8) };
        match sig as usize {
            SIGINT | SIGTERM => exit(0),
            SIGCHLD => reap(),
            _ => {} // EINTR and the like: wait again
        }
    }
}

#[cfg(not(static_pause))]
fn main() {
    run()
}

#[cfg(static_pause)]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    exit(2)
}

#[cfg(static_pause)]
#[no_mangle]
extern "C" fn pause_main() -> ! {
    run()
}

// The kernel enters `_start` with the stack 16-byte aligned and no return address; set up the
// frame a C-ABI function expects and call into Rust.
#[cfg(all(static_pause, target_arch = "x86_64"))]
core::arch::global_asm!(
    ".globl _start",
    "_start:",
    "xor ebp, ebp",
    "and rsp, -16",
    "call pause_main",
    "ud2",
);

#[cfg(all(static_pause, target_arch = "aarch64"))]
core::arch::global_asm!(
    ".globl _start",
    "_start:",
    "mov x29, #0",
    "mov x30, #0",
    "bl pause_main",
    "brk #0",
);
