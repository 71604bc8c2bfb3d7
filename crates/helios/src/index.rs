//! `IndexTensor`: an n-dimensional array of u32 indices on a device (argmax results; class
//! targets and token ids for the kernels that take them).
//!
//! The one decision a reader must know: indices are their own type rather than a `DType` of
//! `Tensor`, because no float operation applies to them; a kernel that produces or consumes
//! indices says so in its signature, and the compiler keeps the two apart. Indices made
//! from host data keep a host copy, so ops that take indices (embedding, cross-entropy)
//! range-check them before recording anything, without a read-back.

use std::sync::Arc;

use helios_vk::{Buffer, MemoryLocation};

use crate::{Device, Error, Result};

/// Row-major u32 indices in device memory. Cloning is cheap (shared storage).
#[derive(Clone)]
pub struct IndexTensor {
    inner: Arc<Inner>,
}

struct Inner {
    device: Device,
    buffer: Buffer,
    shape: Vec<usize>,
    /// The values, when they came from the host.
    host: Option<Box<[u32]>>,
}

impl IndexTensor {
    /// Copies `data` to `device` as indices of `shape` (whose product must be `data.len()`).
    pub fn from_slice(device: &Device, data: &[u32], shape: &[usize]) -> Result<IndexTensor> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(Error::DataLength {
                shape: shape.to_vec(),
                expected,
                got: data.len(),
            });
        }
        let mut t = IndexTensor::empty(device, shape.to_vec())?;
        if !data.is_empty() {
            device
                .context()
                .upload(&t.inner.buffer, 0, bytemuck::cast_slice(data))?;
        }
        if let Some(inner) = Arc::get_mut(&mut t.inner) {
            inner.host = Some(data.into());
        }
        Ok(t)
    }

    /// Indices of `shape` whose values are undefined until a kernel writes them.
    pub(crate) fn empty(device: &Device, shape: Vec<usize>) -> Result<IndexTensor> {
        let bytes = (shape.iter().product::<usize>() * 4) as u64;
        let buffer = device
            .context()
            .create_buffer(bytes, MemoryLocation::DeviceLocal)?;
        Ok(IndexTensor {
            inner: Arc::new(Inner {
                device: device.clone(),
                buffer,
                shape,
                host: None,
            }),
        })
    }

    /// Copies the indices to the host; waits only for the work that writes them.
    pub fn to_vec(&self) -> Result<Vec<u32>> {
        let mut bytes = vec![0u8; self.len() * 4];
        if bytes.is_empty() {
            return Ok(Vec::new());
        }
        self.inner
            .device
            .context()
            .download(&self.inner.buffer, 0, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    pub fn shape(&self) -> &[usize] {
        &self.inner.shape
    }

    /// Number of indices.
    pub fn len(&self) -> usize {
        self.inner.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The values, when they came from the host (`from_slice`).
    pub(crate) fn host(&self) -> Option<&[u32]> {
        self.inner.host.as_deref()
    }

    /// Fails with the first index `>= bound` that is not `allowed`, when the values are known
    /// on the host; indices made on the device pass (each op documents what its kernel does
    /// with an index out of range).
    pub(crate) fn check_range(
        &self,
        op: &'static str,
        bound: usize,
        allowed: Option<u32>,
    ) -> Result<()> {
        let Some(host) = self.host() else {
            return Ok(());
        };
        let bad = host
            .iter()
            .enumerate()
            .find(|&(_, &v)| Some(v) != allowed && v as usize >= bound);
        match bad {
            None => Ok(()),
            Some((at, &value)) => Err(Error::IndexOutOfRange {
                op,
                at,
                value,
                bound,
            }),
        }
    }

    /// The buffer holding the indices (for declaring accesses).
    pub(crate) fn buffer(&self) -> &Buffer {
        &self.inner.buffer
    }
}

impl std::fmt::Debug for IndexTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexTensor")
            .field("shape", &self.shape())
            .finish()
    }
}
