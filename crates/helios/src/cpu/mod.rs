//! The CPU reference: plain Rust, f64 arithmetic rounded once to the storage type, for every
//! GPU op. Tests and `--check` gates compare against it, so it defines the semantics the
//! kernels promise (IEEE 754 / C99: NaN propagation, C `pow`), not what a particular GPU
//! happens to do. One file per kernel family.

pub mod attention;
mod elementwise;
mod embedding;
mod loss;
pub mod matmul;
pub mod norm;
mod optim;
pub mod reduce;
pub mod softmax;

pub use elementwise::*;
pub use embedding::*;
pub use loss::*;
pub use optim::*;
