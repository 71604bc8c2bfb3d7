//! Needs an NVIDIA GPU and NCCL, so every test is ignored by default. On a GPU machine whose
//! Python has NCCL's wheel (nvidia-nccl-cu12 or -cu13; both put it in nvidia/nccl/lib):
//!
//! ```sh
//! export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))'):$LD_LIBRARY_PATH
//! NCCL_NVLS_ENABLE=0 cargo test -p helios-cuda -- --ignored --nocapture --test-threads=1
//! ```
//!
//! A world of one rank checks the whole path (device by UUID, primary context, stream, device
//! memory, unique id, communicator, every collective) on one GPU. Waiting on a Vulkan timeline
//! semaphore needs Vulkan and is tested where the two meet.

use bytemuck::cast_slice;
use half::bf16;
use rand::{rngs::StdRng, Rng, SeedableRng};

use helios_cuda::{
    format_uuid, Comm, Context, Cuda, DeviceBuffer, Error, Nccl, NcclDtype, NcclOp, Stream,
    UniqueId,
};

/// Device 0, found again by its UUID, with a context and a stream on it.
fn device_zero(cuda: &Cuda) -> (Context, Stream) {
    let count = cuda.device_count().expect("cuDeviceGetCount");
    assert!(count > 0, "CUDA sees no device");
    let first = cuda.device(0).expect("device 0");
    let by_uuid = cuda
        .device_by_uuid(&first.uuid())
        .expect("device 0 by UUID");
    assert_eq!(by_uuid.ordinal(), 0);
    println!(
        "checked: {count} device(s); device 0 is {} {}, found again by its UUID",
        first.name(),
        format_uuid(&first.uuid())
    );
    let ctx = by_uuid.primary_context().expect("primary context");
    let stream = Stream::new(&ctx).expect("stream");
    (ctx, stream)
}

/// A world of one rank, its unique id passed through hex as a launcher would.
fn world_of_one(nccl: &Nccl, ctx: &Context) -> Comm {
    let id = UniqueId::new(nccl).expect("ncclGetUniqueId");
    let id = UniqueId::from_hex(&id.to_hex()).expect("hex round trip");
    let comm = Comm::init_rank(nccl, ctx, 1, &id, 0).expect("ncclCommInitRank");
    assert_eq!((comm.world(), comm.rank()), (1, 0));
    println!(
        "checked: NCCL {} made a world of 1 from a unique id passed as hex",
        nccl.version()
    );
    comm
}

/// `n` random values in [-1, 1) as the bytes of `dtype` (f32 or bf16).
fn random_bytes(rng: &mut StdRng, n: usize, dtype: NcclDtype) -> Vec<u8> {
    let values: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    match dtype {
        NcclDtype::F32 => cast_slice(&values).to_vec(),
        NcclDtype::Bf16 => {
            let halves: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            cast_slice(&halves).to_vec()
        }
        other => unreachable!("the test makes no {other:?} data"),
    }
}

fn upload(ctx: &Context, bytes: &[u8]) -> DeviceBuffer {
    let mut buf = DeviceBuffer::alloc(ctx, bytes.len()).expect("cuMemAlloc");
    buf.copy_from_host(bytes).expect("cuMemcpyHtoD");
    buf
}

/// A buffer of NaN-ish 0xff bytes, so that anything a collective fails to write shows.
fn poisoned(ctx: &Context, len: usize) -> DeviceBuffer {
    upload(ctx, &vec![0xff; len])
}

fn download(buf: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    buf.copy_to_host(&mut out).expect("cuMemcpyDtoH");
    out
}

#[test]
#[ignore = "needs an NVIDIA GPU and NCCL"]
fn a_world_of_one_all_reduces_f32_and_bf16_with_sum_and_avg() {
    let cuda = Cuda::load().expect("load libcuda");
    let (ctx, stream) = device_zero(&cuda);
    let nccl = Nccl::load().expect("load NCCL (is its lib directory on LD_LIBRARY_PATH?)");
    let comm = world_of_one(&nccl, &ctx);
    let mut rng = StdRng::seed_from_u64(7);
    // Odd, and over a megabyte: not a multiple of any chunk size NCCL might use.
    let n = (1 << 20) + 7;

    for dtype in [NcclDtype::F32, NcclDtype::Bf16] {
        for op in [NcclOp::Sum, NcclOp::Avg] {
            let input = random_bytes(&mut rng, n, dtype);
            let send = upload(&ctx, &input);
            let recv = poisoned(&ctx, input.len());
            // SAFETY: both buffers hold `n` elements of `dtype` and outlive the synchronize.
            unsafe { comm.all_reduce(send.ptr(), recv.ptr(), n, dtype, op, &stream) }
                .expect("ncclAllReduce");
            stream.synchronize().expect("cuStreamSynchronize");
            comm.async_error().expect("no asynchronous NCCL error");
            // With one rank, the sum of one value is that value, exactly. NCCL 2.28.9's
            // average turned the last 7 of 2^20 + 7 f32 values into NaN on an H200: Helios
            // sums and divides itself, and this test only reports what the average does.
            let out = download(&recv);
            let wrong: Vec<usize> = out
                .chunks(dtype.size_bytes())
                .zip(input.chunks(dtype.size_bytes()))
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .map(|(i, _)| i)
                .collect();
            if op == NcclOp::Avg {
                let first: Vec<String> = wrong.iter().take(3).map(|i| format!("[{i}]")).collect();
                println!(
                    "note: all_reduce Avg of {n} {dtype:?} in a world of 1 changed {} values {}",
                    wrong.len(),
                    first.join(" ")
                );
                continue;
            }
            assert!(
                wrong.is_empty(),
                "{dtype:?} {op:?}: {} of {n} elements differ",
                wrong.len()
            );
            println!("checked: all_reduce {op:?} of {n} {dtype:?} values (random, world of 1)");
        }
    }

    // In place, inside a group.
    let input = random_bytes(&mut rng, n, NcclDtype::F32);
    let buf = upload(&ctx, &input);
    nccl.group(|| {
        // SAFETY: `buf` holds `n` f32 values and outlives the synchronize.
        unsafe {
            comm.all_reduce(
                buf.ptr(),
                buf.ptr(),
                n,
                NcclDtype::F32,
                NcclOp::Sum,
                &stream,
            )
        }
    })
    .expect("grouped in-place all_reduce");
    stream.synchronize().expect("cuStreamSynchronize");
    assert_eq!(
        download(&buf),
        input,
        "in-place all_reduce changed the data"
    );
    println!("checked: in-place all_reduce Sum of {n} f32 values inside a group");
}

#[test]
#[ignore = "needs an NVIDIA GPU and NCCL"]
fn a_world_of_one_broadcasts_reduces_reduce_scatters_and_all_gathers() {
    let cuda = Cuda::load().expect("load libcuda");
    let (ctx, stream) = device_zero(&cuda);
    let nccl = Nccl::load().expect("load NCCL (is its lib directory on LD_LIBRARY_PATH?)");
    let comm = world_of_one(&nccl, &ctx);
    let mut rng = StdRng::seed_from_u64(11);
    let n = 4099;
    let dtype = NcclDtype::Bf16;
    let input = random_bytes(&mut rng, n, dtype);
    let send = upload(&ctx, &input);

    // With one rank, each of these copies `send` to `recv`.
    type Collective<'a> = &'a dyn Fn(&DeviceBuffer) -> helios_cuda::Result<()>;
    let cases: [(&str, Collective); 4] = [
        // SAFETY (all four): `send` and `recv` hold `n` bf16 values and outlive the sync.
        ("broadcast from root 0", &|recv| unsafe {
            comm.broadcast(send.ptr(), recv.ptr(), n, dtype, 0, &stream)
        }),
        ("reduce Sum to root 0", &|recv| unsafe {
            comm.reduce(send.ptr(), recv.ptr(), n, dtype, NcclOp::Sum, 0, &stream)
        }),
        ("reduce_scatter Sum", &|recv| unsafe {
            comm.reduce_scatter(send.ptr(), recv.ptr(), n, dtype, NcclOp::Sum, &stream)
        }),
        ("all_gather", &|recv| unsafe {
            comm.all_gather(send.ptr(), recv.ptr(), n, dtype, &stream)
        }),
    ];
    for (what, run) in cases {
        let recv = poisoned(&ctx, input.len());
        run(&recv).expect(what);
        stream.synchronize().expect("cuStreamSynchronize");
        assert_eq!(download(&recv), input, "{what} did not copy the data");
        println!("checked: {what} of {n} bf16 values (world of 1)");
    }

    // SAFETY: rejected before NCCL is called.
    let bad_root = unsafe { comm.broadcast(send.ptr(), send.ptr(), n, dtype, 1, &stream) };
    assert!(matches!(bad_root, Err(Error::InvalidArgument { .. })));
    // SAFETY: rejected before NCCL is called.
    let bad_root =
        unsafe { comm.reduce(send.ptr(), send.ptr(), n, dtype, NcclOp::Sum, 1, &stream) };
    assert!(matches!(bad_root, Err(Error::InvalidArgument { .. })));
    println!("checked: broadcast and reduce to a root outside the world are refused");
    comm.abort().expect("ncclCommAbort");
    println!("checked: abort");
}

#[test]
#[ignore = "needs an NVIDIA GPU and NCCL"]
fn driver_errors_and_unknown_uuids_are_reported_with_names() {
    let cuda = Cuda::load().expect("load libcuda");
    let (ctx, _stream) = device_zero(&cuda);

    match DeviceBuffer::alloc(&ctx, 1 << 60) {
        Err(e @ Error::Cuda { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{msg}");
            println!("checked: an impossible allocation reports {msg}");
        }
        other => panic!("expected Error::Cuda, got {other:?}"),
    }

    match cuda.device_by_uuid(&[0xab; 16]) {
        Err(Error::NoDevice { seen, uuid }) => {
            assert_eq!(seen.len(), cuda.device_count().unwrap());
            assert_eq!(uuid, format_uuid(&[0xab; 16]));
            println!(
                "checked: an unknown UUID lists the {} device(s) seen",
                seen.len()
            );
        }
        other => panic!("expected Error::NoDevice, got {other:?}"),
    }
}
