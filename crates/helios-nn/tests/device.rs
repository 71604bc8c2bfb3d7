//! Host ↔ device: `HostTensor` and `ParamStore` through `helios::Tensor`, on the environment's
//! Vulkan device (lavapipe without a GPU; run with HELIOS_VALIDATION=1 as scripts/test.sh does).

mod common;

use helios::{DType, Device};
use helios_nn::{HostTensor, ParamStore};

fn device() -> Device {
    Device::from_env().expect("a Vulkan device (install mesa-vulkan-drivers)")
}

#[test]
fn host_tensors_upload_and_download() {
    let dev = device();
    let t = HostTensor::new(vec![2, 3], vec![1.0, -2.5, 3.25, 1e-3, 65504.0, -0.0]).unwrap();
    let d = t.upload(&dev, DType::F32).unwrap();
    assert_eq!(d.shape(), [2, 3]);
    let back = HostTensor::download(&d).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.data[5].to_bits(), (-0.0f32).to_bits());
    // Narrow storage rounds exactly as HostTensor::round_to does.
    for dtype in [DType::BF16, DType::F16] {
        let mut rounded = t.clone();
        rounded.round_to(dtype);
        let d = t.upload(&dev, dtype).unwrap();
        assert_eq!(d.dtype(), dtype);
        assert_eq!(HostTensor::download(&d).unwrap(), rounded, "{dtype}");
    }
    assert!(HostTensor::new(vec![2, 2], vec![1.0]).is_err());
    let m = dev.validation_messages();
    assert!(m.is_empty(), "validation messages:\n{}", m.join("\n"));
}

#[test]
fn a_parameter_store_round_trips_through_the_device() {
    let dev = device();
    let config = common::small_config();
    let store = ParamStore::init_gpt2(&config, 11).unwrap();
    let on_device = store.upload(&dev, DType::F32).unwrap();
    assert_eq!(on_device.len(), config.param_specs().len());
    for (spec, t) in &on_device {
        assert_eq!(t.shape(), spec.shape.as_slice(), "{}", spec.name);
    }
    let mut back = ParamStore::zeros(&config).unwrap();
    back.download(on_device.iter().map(|(s, t)| (s.name.as_str(), t)))
        .unwrap();
    assert_eq!(back, store);
    // A download missing a parameter is refused and leaves the store as it was.
    let partial = on_device.iter().skip(1).map(|(s, t)| (s.name.as_str(), t));
    assert!(back.download(partial).is_err());
    assert_eq!(back, store);
    let m = dev.validation_messages();
    assert!(m.is_empty(), "validation messages:\n{}", m.join("\n"));
}
