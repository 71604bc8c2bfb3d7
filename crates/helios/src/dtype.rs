//! Element types of tensors. Storage may be narrow; arithmetic in kernels is always f32.
//!
//! Host conversions round to nearest even (the `half` crate), exactly as the kernels'
//! `store_f32` does, so a value written by the host and by a kernel has the same bits.

use helios_kernels::Storage;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    /// IEEE binary16 storage.
    F16,
    /// bfloat16 storage (the top half of an f32; kernels widen it with a shift).
    BF16,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Every dtype, for tests and casts.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    /// The kernels' storage format for this dtype.
    pub const fn storage(self) -> Storage {
        match self {
            DType::F32 => Storage::F32,
            DType::F16 => Storage::F16,
            DType::BF16 => Storage::BF16,
        }
    }

    /// `v` rounded to this type and widened back (what storing and loading does).
    pub fn round(self, v: f32) -> f32 {
        match self {
            DType::F32 => v,
            DType::F16 => half::f16::from_f32(v).to_f32(),
            DType::BF16 => half::bf16::from_f32(v).to_f32(),
        }
    }

    /// Host bytes of `data` in this type.
    pub(crate) fn encode(self, data: &[f32]) -> Vec<u8> {
        match self {
            DType::F32 => bytemuck::cast_slice(data).to_vec(),
            DType::F16 => data
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            DType::BF16 => data
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        }
    }

    /// f32 values of host `bytes` of this type.
    pub(crate) fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            DType::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
