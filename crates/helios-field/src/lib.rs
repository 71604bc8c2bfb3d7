//! helios-field: arithmetic in the BLS12-381 base field Fq on any Vulkan GPU.
//!
//! Kernels (add, sub, neg, Montgomery mul and square, to/from Montgomery form) are generated
//! with the helios-spirv IR; the host sees elements as `[u64; 6]` little-endian limbs.
//! Three ways to drive them:
//! - device-resident: [`Field::upload`] once, run many [`Batch`]es of operations on
//!   [`FqVec`] slices, [`Field::download`] when needed;
//! - one-shot: [`Field::compute`] / [`Field::compute_batch`] move host arrays in, compute
//!   and move results out in one submit;
//! - streaming: [`Field::stream`] pipelines chunks of arbitrarily long host arrays.
//!
//! Inputs that are not canonical (≥ p) are rejected with [`FieldError::NonCanonical`] before
//! anything is submitted, and every kernel returns canonical values, so the device never holds
//! anything else. [`cpu`] is the blst reference and baseline the tests and the benchmark use.
//!
//! How the modules relate: `fq` holds the field's constants and host elements; `arith` emits
//! the multi-limb arithmetic into the kernel IR for each [`Layout`] (the schoolbook `u32mix`,
//! and the product-scanning multipliers of `comba`, one of them the default); `kernel` wraps
//! it into the kernels and their launches. `engine` runs them on device-resident arrays,
//! with `hazards` placing a batch's barriers and `transfer` moving elements between host
//! and buffers; `host` (one-shot) and `stream` (chunked) drive `engine` from host arrays,
//! and `env` reads the `HELIOS_FIELD_*` switches.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use helios_field::{Field, FieldOp, Batch};
//! let field = Field::new(helios_vk::Context::from_env()?)?;   // HELIOS_FIELD_* switches
//! let (a, b) = (helios_field::random_elements(1024, 1), helios_field::random_elements(1024, 2));
//! let (da, db, dc) = (field.upload(&a)?, field.upload(&b)?, field.alloc(1024)?);
//! let mut batch = Batch::new();
//! batch.push(FieldOp::Mul, &[da.all(), db.all()], dc.all())?;   // c = a·b·R⁻¹
//! batch.push(FieldOp::Add, &[dc.all(), da.all()], dc.all())?;   // c += a (barrier inserted)
//! field.run(&batch)?;
//! let c = field.download(dc.all())?;
//! # Ok(()) }
//! ```

mod arith;
#[cfg(test)]
mod census;
mod comba;
pub mod cpu;
mod engine;
pub mod env;
mod error;
mod fq;
mod hazards;
mod host;
mod kernel;
mod stream;
mod transfer;

pub use arith::Layout;
pub use engine::{Batch, Field, FieldConfig, FqSlice, FqVec, DEFAULT_DEVICE_LOCAL, DEFAULT_LAYOUT};
pub use error::{FieldError, Result};
pub use fq::{
    check_canonical, edge_elements, is_canonical, random_elements, to_hex, Fq, FQ_BYTES, ONE, P,
    P_INV_NEG, R2_MOD_P, R_MOD_P,
};
pub use host::Job;
pub use kernel::{build_mul_chain, FieldKernel, FieldOp, FIELD_WORKGROUP, MAX_DISPATCH_ELEMENTS};
pub use stream::DEFAULT_STREAM_CHUNK;
