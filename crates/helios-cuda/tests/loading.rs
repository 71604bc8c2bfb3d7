//! Loading the libraries, as CI sees it: on a machine without CUDA, `Cuda::load` and
//! `Nccl::load` must fail with an `Error::Library` that says what was tried and what to install.
//! Where a library is present (a GPU machine) the check has nothing to say and says so.

use std::path::Path;

use helios_cuda::{Cuda, Error, Nccl, LIBCUDA, LIBNCCL};

#[test]
fn loading_cuda_without_a_driver_names_the_files_tried_and_the_driver_to_install() {
    match Cuda::load() {
        Err(Error::Library { name, tried, .. }) => {
            let msg = Cuda::load().err().unwrap().to_string();
            assert_eq!(name, LIBCUDA);
            assert_eq!(tried, ["libcuda.so.1", "libcuda.so"]);
            assert!(msg.contains("libcuda.so.1, libcuda.so"), "{msg}");
            assert!(msg.contains("NVIDIA driver"), "{msg}");
            assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
            println!("as expected without CUDA: {msg}");
        }
        Err(other) => println!("libcuda is here but unusable, so not checked: {other}"),
        Ok(_) => println!("libcuda loads here, so the missing-driver message is not checked"),
    }
}

#[test]
fn loading_nccl_without_nccl_names_the_files_tried_and_the_packages_to_install() {
    match Nccl::load() {
        Err(Error::Library { name, tried, .. }) => {
            let msg = Nccl::load().err().unwrap().to_string();
            assert_eq!(name, LIBNCCL);
            assert_eq!(tried, ["libnccl.so.2", "libnccl.so"]);
            assert!(msg.contains("pip install nvidia-nccl-cu12"), "{msg}");
            assert!(msg.contains("nvidia/nccl/lib"), "{msg}");
            assert!(msg.contains("libnccl2"), "{msg}");
            println!("as expected without NCCL: {msg}");
        }
        Err(other) => println!("libnccl is here but unusable, so not checked: {other}"),
        Ok(nccl) => println!(
            "NCCL {} loads here, so the missing-library message is not checked",
            nccl.version()
        ),
    }
}

#[test]
fn nccl_from_a_path_that_does_not_exist_names_that_path() {
    let path = "/nonexistent/helios/libnccl.so.2";
    match Nccl::load_from(Path::new(path)) {
        Err(Error::Library { name, tried, .. }) => {
            assert_eq!(name, LIBNCCL);
            assert_eq!(tried, [path]);
        }
        other => panic!("expected Error::Library, got {:?}", other.err()),
    }
}

#[test]
fn a_library_without_the_symbols_is_reported_with_the_first_missing_symbol() {
    // libc loads everywhere Helios runs and exports none of NCCL's names.
    match Nccl::load_from(Path::new("libc.so.6")) {
        Err(e @ Error::Library { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("does not export ncclGetVersion"), "{msg}");
            assert!(msg.contains("libc.so.6"), "{msg}");
        }
        other => panic!("expected Error::Library, got {:?}", other.err()),
    }
}
