// Instance creation, adapter enumeration and probing, device selection, context creation.

mod common;

use helios_vk::{select_adapter, Context, DeviceType, Error};

#[test]
fn adapters_enumerate_with_caps() {
    let instance = common::instance();
    let adapters = instance.adapters().unwrap();
    assert!(!adapters.is_empty(), "no Vulkan device");
    for (i, a) in adapters.iter().enumerate() {
        let c = a.caps();
        assert_eq!(a.index(), i);
        assert!(!c.name.is_empty());
        assert_eq!(c.api_version.split('.').count(), 3, "{}", c.api_version);
        assert_eq!(c.device_uuid.len(), 32);
        assert_eq!(c.pipeline_cache_uuid.len(), 32);
        assert!(!c.memory_heaps.is_empty() && !c.memory_types.is_empty());
        assert!(c.queue_families.iter().any(|q| q.has("compute")));
        assert!(c.subgroup.size > 0);
        assert!(c.subgroup.operations.iter().any(|o| o == "basic"));
        assert!(c.limits.max_push_constants_size >= 128);
        assert!(c.limits.max_workgroup_invocations >= 128);
        assert!(
            c.extensions.windows(2).all(|w| w[0] < w[1]),
            "sorted, unique"
        );
        assert_eq!(
            c.features.push_descriptor,
            c.has_extension("VK_KHR_push_descriptor")
        );
        if c.device_type == DeviceType::Cpu {
            // lavapipe, as described in ANCHORS.md.
            assert!(c.unified_memory && c.host_visible_device_local);
            assert!(c.features.timeline_semaphore && c.features.buffer_device_address);
            assert!(c.features.shader_int64);
            assert!(c.cooperative_matrix.is_empty());
        }
    }
    common::assert_no_validation_messages(&instance);
}

#[test]
fn selection_by_index_name_and_no_match() {
    let instance = common::instance();
    let adapters = instance.adapters().unwrap();
    let default = select_adapter(&adapters, None).unwrap();
    let best = adapters
        .iter()
        .map(|a| a.caps().device_type.preference())
        .min();
    assert_eq!(Some(default.caps().device_type.preference()), best);

    for a in &adapters {
        let by_index = select_adapter(&adapters, Some(&a.index().to_string())).unwrap();
        assert_eq!(by_index.index(), a.index());
        // Any case, any part of the name.
        let part = a.name().to_uppercase();
        let part = &part[..part.len().min(5)];
        let by_name = select_adapter(&adapters, Some(part)).unwrap();
        assert!(by_name.name().to_uppercase().contains(part));
    }

    let err = select_adapter(&adapters, Some("no-such-gpu-xyz")).unwrap_err();
    assert!(matches!(err, Error::NoMatchingDevice { .. }));
    let text = err.to_string();
    assert!(text.contains(adapters[0].name()), "lists devices: {text}");
    let err = select_adapter(&adapters, Some("99")).unwrap_err();
    assert!(matches!(err, Error::NoMatchingDevice { .. }));
    assert!(matches!(select_adapter(&[], None), Err(Error::NoDevice)));
    common::assert_no_validation_messages(&instance);
}

#[test]
fn context_enables_supported_features() {
    let ctx = common::context();
    let (caps, on) = (ctx.caps(), ctx.enabled());
    assert!(on.buffer_device_address && on.timeline_semaphore);
    assert_eq!(on.shader_int64, caps.features.shader_int64);
    assert_eq!(on.shader_float16, caps.features.shader_float16);
    assert_eq!(on.storage_buffer_16bit, caps.features.storage_buffer_16bit);
    assert_eq!(on.push_descriptor, caps.features.push_descriptor);
    // Enabled implies supported; without validation, supported implies enabled too (an old
    // validation layer makes Helios leave newer extensions off).
    assert!(!on.cooperative_matrix || caps.features.cooperative_matrix);
    assert!(!on.bfloat16 || caps.features.bfloat16);
    if ctx.instance().validation_layer_version().is_none() {
        assert_eq!(on.cooperative_matrix, caps.features.cooperative_matrix);
        assert_eq!(on.bfloat16, caps.features.bfloat16);
    }
    let family = &caps.queue_families[ctx.queue_family_index() as usize];
    assert!(family.has("compute"));
    assert_eq!(ctx.last_submitted(), 0);
    assert_eq!(ctx.completed().unwrap(), 0);
    ctx.pipeline_cache_data().unwrap();
    common::finish(ctx);
}

#[test]
fn adapter_from_another_instance_is_refused() {
    let a = common::instance();
    let b = common::instance();
    let adapters = a.adapters().unwrap();
    let err = Context::new(b.clone(), &adapters[0]).unwrap_err();
    assert!(matches!(err, Error::ForeignAdapter), "{err}");
    common::assert_no_validation_messages(&a);
    common::assert_no_validation_messages(&b);
}
