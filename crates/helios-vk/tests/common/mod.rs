//! Shared helpers for helios-vk's integration tests: a validated context on whatever device
//! is present, the "no validation messages" check, deterministic random bytes, and the tiny
//! rspirv-built compute shader the pipeline tests run.
#![allow(dead_code)] // each test binary uses a different subset

pub mod shader;

use helios_vk::{env, Context, ContextOptions, Instance, InstanceOptions};
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

/// Held by a test thread from its first instance on until the thread ends (libtest runs each
/// test on its own thread), so the tests of a binary never use Vulkan at the same time.
/// The Khronos validation layer (Debian's 1.3.239) races one device's creation against
/// another device's commands: a test creating its context while another recorded a
/// dispatch crashed in the layer's vkCmdDispatch on a null entry point, about once in 500
/// runs of `pipeline_cache` (core dump, session 22).
static SERIAL: Mutex<()> = Mutex::new(());

thread_local! {
    static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

fn serialize() {
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.is_none() {
            *held = Some(SERIAL.locked());
        }
    });
}

/// `lock` that recovers the guard of a poisoned mutex. The tests' locks only serialise
/// tests (they guard `()`), so a test that panicked while holding one poisoned nothing it
/// protects, and recovering keeps one failure from failing every later test of the binary.
pub trait LockExt<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Tests run with validation on unless HELIOS_VALIDATION=0: a message is a failure.
pub fn options() -> InstanceOptions {
    let validation = env::flag(env::HELIOS_VALIDATION)
        .expect("HELIOS_VALIDATION must be 0 or 1")
        .unwrap_or(true);
    InstanceOptions { validation }
}

pub fn instance() -> Arc<Instance> {
    serialize();
    Arc::new(Instance::new(&options()).expect("create Vulkan instance"))
}

/// A Context on the device HELIOS_DEVICE selects (default order otherwise).
pub fn context() -> Arc<Context> {
    let instance = instance();
    let adapters = instance.adapters().expect("enumerate adapters");
    let adapter = helios_vk::select_adapter_from_env(&adapters).expect("select adapter");
    Context::new(instance.clone(), adapter).expect("create context")
}

/// [`context`] with explicit options (pipeline cache, statistics, ...).
pub fn context_with(options: &ContextOptions) -> Arc<Context> {
    let instance = instance();
    let adapters = instance.adapters().expect("enumerate adapters");
    let adapter = helios_vk::select_adapter_from_env(&adapters).expect("select adapter");
    Context::with_options(instance.clone(), adapter, options).expect("create context")
}

/// Fails the test if the validation layer reported anything.
#[track_caller]
pub fn assert_no_validation_messages(instance: &Instance) {
    let messages = instance.validation_messages();
    assert!(
        messages.is_empty(),
        "{} validation message(s):\n{}",
        messages.len(),
        messages.join("\n")
    );
}

/// Ends a test: checks for validation messages, then drops the context (which destroys the
/// device if nothing else holds it) and checks again, so destruction is validated too.
#[track_caller]
pub fn finish(ctx: Arc<Context>) {
    let instance = Arc::clone(ctx.instance());
    assert_no_validation_messages(&instance);
    drop(ctx);
    assert_no_validation_messages(&instance);
}

/// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}
