//! The one error type of helios-field. Bad input from a caller (a value ≥ p, lengths that
//! disagree, a slice out of range, a buffer from another device) is a value with a message
//! that says what to do, detected before anything is recorded or submitted.

/// `Result` with [`FieldError`].
pub type Result<T, E = FieldError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum FieldError {
    #[error(
        "input `{input}` element {index} is {value}, which is not a canonical Fq element \
         (it is >= p); reduce it modulo p before passing it in"
    )]
    NonCanonical {
        input: &'static str,
        index: usize,
        value: String,
    },

    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },

    #[error("{what}: elements {start}..{end} are outside an array of {len} elements")]
    OutOfRange {
        what: &'static str,
        start: usize,
        end: usize,
        len: usize,
    },

    #[error(
        "{what} was created by a Field on another Vulkan context; use one Field's arrays together"
    )]
    ForeignArray { what: &'static str },

    #[error("{what} of {size} elements is too large (at most {max}); split the work into chunks")]
    TooLarge {
        what: &'static str,
        size: usize,
        max: usize,
    },

    #[error("environment variable {name}={value:?} is not valid: {expected}")]
    BadEnvVar {
        name: &'static str,
        value: String,
        expected: &'static str,
    },

    #[error(transparent)]
    Vulkan(#[from] helios_vk::Error),
}
