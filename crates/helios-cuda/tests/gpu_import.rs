//! Needs an NVIDIA GPU (run with `cargo test -p helios-cuda -- --ignored --nocapture`). Its own
//! test binary, so that a driver that mishandles a foreign fd cannot take the other GPU tests
//! down with it.
//!
//! A real import needs an fd exported by Vulkan and is tested where the two meet; here an fd
//! that is not GPU memory checks the failure path: CUDA refuses it and the fd is closed.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use helios_cuda::{Cuda, Error, ExternalMemory, ExternalSemaphore};

fn dev_null() -> (OwnedFd, i32) {
    let fd = OwnedFd::from(File::open("/dev/null").expect("open /dev/null"));
    let raw = fd.as_raw_fd();
    (fd, raw)
}

fn is_open(raw: i32) -> bool {
    Path::new(&format!("/proc/self/fd/{raw}")).exists()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn importing_an_fd_that_is_not_gpu_memory_fails_and_closes_the_fd() {
    let cuda = Cuda::load().expect("load libcuda");
    let ctx = cuda
        .device(0)
        .and_then(|d| d.primary_context())
        .expect("device 0 context");

    let (fd, raw) = dev_null();
    match ExternalMemory::import(&ctx, fd, 1 << 20, true) {
        Err(e @ Error::Cuda { .. }) => println!("checked: memory import of /dev/null: {e}"),
        other => panic!("expected Error::Cuda, got {other:?}"),
    }
    assert!(!is_open(raw), "the fd was left open after a failed import");
    println!("checked: the fd is closed after the failed memory import");

    let (fd, raw) = dev_null();
    match ExternalSemaphore::import_timeline(&ctx, fd) {
        Err(e @ Error::Cuda { .. }) => println!("checked: semaphore import of /dev/null: {e}"),
        Err(other) => panic!("expected Error::Cuda, got {other}"),
        Ok(_) => panic!("CUDA imported /dev/null as a timeline semaphore"),
    }
    assert!(!is_open(raw), "the fd was left open after a failed import");
    println!("checked: the fd is closed after the failed semaphore import");
}
