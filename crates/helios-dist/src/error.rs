use thiserror::Error;

pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong between ranks, or in starting them.
#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Helios(#[from] helios::Error),
    #[error(transparent)]
    Vulkan(#[from] helios_vk::Error),
    #[error(transparent)]
    Cuda(#[from] helios_cuda::Error),
    /// A launcher variable is missing, malformed or inconsistent.
    #[error("{0}")]
    Environment(String),
    /// The ranks disagree about something that must be the same on all of them.
    #[error("rank {rank} disagrees with rank 0 about {what}; every rank must run the same command on the same data")]
    Disagree { rank: usize, what: String },
    #[error("MPI: {0}")]
    Mpi(String),
    /// This build cannot talk to the ranks the environment describes.
    #[error("{0}")]
    Unsupported(String),
    #[error("launcher: {0}")]
    Launch(String),
    /// The optimizer state's shards (ZeRO-1) do not fit the call or the run.
    #[error("sharded optimizer state (ZeRO-1): {0}")]
    Zero(String),
}
