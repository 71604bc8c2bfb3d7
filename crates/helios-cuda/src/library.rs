//! Opening a shared library by the first of several names, and resolving its symbols.
//!
//! CUDA and NCCL are found at run time so that Helios builds, and runs its CPU paths, on a
//! machine without them; a missing file or symbol becomes [`Error::Library`].

use libloading::Library;

use crate::error::{Error, Result};

/// A library opened but not yet resolved: remembers what it is, for error messages.
pub(crate) struct Loader {
    lib: Library,
    what: &'static str,
    file: String,
}

impl Loader {
    /// Opens the first of `names` that the dynamic loader finds (LD_LIBRARY_PATH, the
    /// ld.so cache, the system directories; a name with a '/' is taken as a path).
    pub(crate) fn open(what: &'static str, names: &[&str]) -> Result<Loader> {
        let mut failures = Vec::new();
        for name in names {
            // SAFETY: opening runs the library's initialisers. The libraries opened here are the
            // NVIDIA driver's libcuda and NCCL (or a file the caller named as NCCL), whose
            // initialisers have no preconditions on this process.
            match unsafe { Library::new(name) } {
                Ok(lib) => {
                    return Ok(Loader {
                        lib,
                        what,
                        file: (*name).to_string(),
                    })
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
        Err(Error::Library {
            name: what,
            tried: names.iter().map(|n| n.to_string()).collect(),
            detail: failures.join("; "),
        })
    }

    /// The first of `names` that the library exports.
    ///
    /// # Safety
    /// `T` must be the function pointer type of the C declaration of every name in `names`.
    pub(crate) unsafe fn get<T: Copy>(&self, names: &[&str]) -> Result<T> {
        match self.get_optional(names) {
            Some(f) => Ok(f),
            None => Err(Error::Library {
                name: self.what,
                tried: vec![self.file.clone()],
                detail: format!(
                    "{} does not export {}, so it is older than Helios needs (or not {})",
                    self.file,
                    names.join(" or "),
                    self.what
                ),
            }),
        }
    }

    /// Like [`Loader::get`], for symbols that only newer versions have.
    ///
    /// # Safety
    /// As for [`Loader::get`].
    pub(crate) unsafe fn get_optional<T: Copy>(&self, names: &[&str]) -> Option<T> {
        names
            .iter()
            .find_map(|name| self.lib.get::<T>(name.as_bytes()).ok().map(|s| *s))
    }

    /// The library, to keep beside the resolved pointers for as long as they are called.
    pub(crate) fn into_library(self) -> Library {
        self.lib
    }
}
