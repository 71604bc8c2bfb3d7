// Buffers and host transfers: sizes (0, odd, 3 MiB, more than one staging chunk), both
// memory locations, range checks, and copies between buffers.

mod common;

use helios_vk::{Error, MemoryLocation, STAGING_CHUNK};

const LOCATIONS: [MemoryLocation; 2] = [MemoryLocation::DeviceLocal, MemoryLocation::HostVisible];

#[test]
fn create_including_size_zero() {
    let ctx = common::context();
    for location in LOCATIONS {
        for size in [0u64, 1, 3, 16, 4096] {
            let buf = ctx.create_buffer(size, location).unwrap();
            assert_eq!(buf.size(), size);
            assert_eq!(buf.location(), location);
            assert_ne!(buf.device_address(), 0);
            // Device-local memory is mapped too where it is host-visible (unified memory).
            if location == MemoryLocation::HostVisible {
                assert!(buf.is_mapped());
            }
        }
        // Zero-length transfers at the end are fine; anything past it is not.
        let empty = ctx.create_buffer(0, location).unwrap();
        ctx.upload(&empty, 0, &[]).unwrap();
        ctx.download(&empty, 0, &mut []).unwrap();
        let err = ctx.upload(&empty, 0, &[1]).unwrap_err();
        assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
    }
    common::finish(ctx);
}

#[test]
fn round_trip_both_locations() {
    let ctx = common::context();
    for location in LOCATIONS {
        for (seed, size) in [(1u64, 1usize), (2, 1000), (3, 3 << 20)] {
            let buf = ctx.create_buffer(size as u64, location).unwrap();
            let data = common::random_bytes(size, seed);
            ctx.upload(&buf, 0, &data).unwrap();
            let mut back = vec![0u8; size];
            ctx.download(&buf, 0, &mut back).unwrap();
            assert!(back == data, "{location:?} {size} bytes differ");
        }
    }
    common::finish(ctx);
}

#[test]
fn offsets_and_range_errors() {
    let ctx = common::context();
    for location in LOCATIONS {
        let buf = ctx.create_buffer(100, location).unwrap();
        ctx.upload(&buf, 0, &[0u8; 100]).unwrap();
        ctx.upload(&buf, 37, &[7u8; 10]).unwrap();
        let mut back = [0u8; 100];
        ctx.download(&buf, 0, &mut back).unwrap();
        assert!(back[..37].iter().all(|&b| b == 0));
        assert!(back[37..47].iter().all(|&b| b == 7));
        assert!(back[47..].iter().all(|&b| b == 0));
        let mut part = [0u8; 3];
        ctx.download(&buf, 45, &mut part).unwrap();
        assert_eq!(part, [7, 7, 0]);

        let err = ctx.upload(&buf, 95, &[0u8; 6]).unwrap_err();
        assert!(
            err.to_string().contains("outside a buffer of 100 bytes"),
            "{err}"
        );
        let err = ctx.download(&buf, u64::MAX, &mut [0u8; 2]).unwrap_err();
        assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
    }
    common::finish(ctx);
}

#[test]
fn staging_in_several_chunks() {
    let ctx = common::context();
    let size = (STAGING_CHUNK + STAGING_CHUNK / 2 + 12) as usize;
    let buf = ctx
        .create_buffer(size as u64 + 4, MemoryLocation::DeviceLocal)
        .unwrap();
    let data = common::random_bytes(size, 9);
    ctx.upload(&buf, 4, &data).unwrap();
    let mut back = vec![0u8; size];
    ctx.download(&buf, 4, &mut back).unwrap();
    assert!(back == data);
    drop(buf);
    common::finish(ctx);
}

#[test]
fn copy_between_buffers() {
    let ctx = common::context();
    let a = ctx
        .create_buffer(4096, MemoryLocation::DeviceLocal)
        .unwrap();
    let b = ctx
        .create_buffer(4096, MemoryLocation::HostVisible)
        .unwrap();
    let data = common::random_bytes(4096, 5);
    ctx.upload(&a, 0, &data).unwrap();
    ctx.submit_and_wait(|rec| {
        rec.copy_buffer(&a, 0, &b, 0, 2048)?;
        rec.copy_buffer(&a, 2048, &b, 2048, 0)?; // size 0: nothing recorded
        rec.barrier();
        // Same buffer, disjoint ranges.
        rec.copy_buffer(&b, 0, &b, 2048, 2048)
    })
    .unwrap();
    let mut back = vec![0u8; 4096];
    ctx.download(&b, 0, &mut back).unwrap();
    assert_eq!(back[..2048], data[..2048]);
    assert_eq!(back[2048..], data[..2048]);

    let err = ctx
        .submit_and_wait(|rec| rec.copy_buffer(&b, 0, &b, 100, 200))
        .unwrap_err();
    assert!(matches!(err, Error::OverlappingCopy), "{err}");
    let err = ctx
        .submit_and_wait(|rec| rec.copy_buffer(&a, 4000, &b, 0, 100))
        .unwrap_err();
    assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
    drop((a, b));
    common::finish(ctx);
}

#[test]
fn out_of_memory_names_the_size() {
    let ctx = common::context();
    let huge = 1u64 << 50;
    let err = ctx
        .create_buffer(huge, MemoryLocation::DeviceLocal)
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains(&huge.to_string()), "{text}");
    common::finish(ctx);
}

#[test]
fn buffers_of_another_context_are_refused() {
    let a = common::context();
    let b = common::context();
    let buf = b.create_buffer(16, MemoryLocation::DeviceLocal).unwrap();
    let err = a.upload(&buf, 0, &[0u8; 16]).unwrap_err();
    assert!(matches!(err, Error::ForeignObject { .. }), "{err}");
    drop(buf);
    common::finish(a);
    common::finish(b);
}
