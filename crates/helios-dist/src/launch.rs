//! `helios train --nproc N`: starts N ranks of the same command on this host, one per GPU,
//! and stops them all when one fails.
//!
//! Two ways, chosen by what the host and this build can do: where NCCL runs (NVIDIA GPUs, the
//! NCCL library found), as N children of this process with `RANK`, `LOCAL_RANK` and
//! `WORLD_SIZE` set, as `torchrun` would, finding each other through `NCCL_COMM_ID`;
//! otherwise under `mpiexec` when the build has MPI.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Runs `program args` as `nproc` ranks and waits for them; an error names the first rank
/// that failed (the others were stopped).
pub fn launch(nproc: usize, program: &Path, args: &[OsString]) -> Result<()> {
    if nproc == 0 {
        return Err(Error::Launch("--nproc must be at least 1".into()));
    }
    // NCCL where it runs: the ranks are our children, and find each other at a local port.
    let nccl = crate::nccl::available(nproc);
    if nccl.is_ok() {
        let port = free_port()?;
        let env = [("NCCL_COMM_ID".to_string(), format!("127.0.0.1:{port}"))];
        return spawn_ranks(nproc, program, args, &env);
    }
    if !crate::HAS_MPI {
        return Err(Error::Unsupported(format!(
            "--nproc {nproc} needs NCCL or MPI. NCCL cannot run here ({}); and this helios \
             was built without MPI: build it with `cargo build --release --features mpi` \
             (MPICH: `apt-get install mpich libmpich-dev libclang-dev`)",
            nccl.unwrap_err()
        )));
    }
    let mpiexec = find_mpiexec().ok_or_else(|| {
        Error::Launch(
            "this helios uses MPI, but no `mpiexec` is on PATH: install MPICH (`apt-get install \
             mpich`)"
                .into(),
        )
    })?;
    let status = Command::new(&mpiexec)
        .arg("-n")
        .arg(nproc.to_string())
        .arg(program)
        .args(args)
        .status()
        .map_err(|e| Error::Launch(format!("cannot start {}: {e}", mpiexec.display())))?;
    match status.success() {
        true => Ok(()),
        // mpiexec has stopped the other ranks and printed which one failed.
        false => Err(Error::Launch(format!(
            "a rank failed ({status}); mpiexec stopped the others"
        ))),
    }
}

/// A TCP port free on this host now, for rank 0's NCCL bootstrap.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::Launch(format!("no free local port for NCCL: {e}")))?;
    Ok(listener
        .local_addr()
        .map_err(|e| Error::Launch(e.to_string()))?
        .port())
}

/// `mpiexec` on PATH (MPICH's; Hydra's own name as a fallback).
fn find_mpiexec() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["mpiexec", "mpiexec.hydra"].map(|n| dir.join(n)))
        .find(|p| p.is_file())
}

/// Starts `nproc` children running `program args`, rank `r` with `RANK=r`, `LOCAL_RANK=r`,
/// `WORLD_SIZE=nproc` (and `LOCAL_WORLD_SIZE`) and `env` set, and waits for all of them.
/// When one exits unsuccessfully (or is killed) the others are killed at once: a rank
/// waiting in a collective for a dead peer would otherwise wait for ever.
pub fn spawn_ranks(
    nproc: usize,
    program: &Path,
    args: &[OsString],
    env: &[(String, String)],
) -> Result<()> {
    let mut children: Vec<Option<Child>> = Vec::with_capacity(nproc);
    for rank in 0..nproc {
        let spawned = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", nproc.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .spawn();
        match spawned {
            Ok(c) => children.push(Some(c)),
            Err(e) => {
                stop(&mut children);
                return Err(Error::Launch(format!(
                    "cannot start rank {rank} ({}): {e}",
                    program.display()
                )));
            }
        }
    }
    let mut poll = Duration::from_millis(1);
    loop {
        let mut running = 0;
        for rank in 0..nproc {
            let Some(child) = children[rank].as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(None) => running += 1,
                Ok(Some(status)) if status.success() => children[rank] = None,
                Ok(Some(status)) => {
                    children[rank] = None;
                    let others = stop(&mut children);
                    return Err(Error::Launch(format!(
                        "rank {rank} failed ({status}); stopped the other {others} rank{}",
                        if others == 1 { "" } else { "s" }
                    )));
                }
                Err(e) => {
                    stop(&mut children);
                    return Err(Error::Launch(format!("cannot wait for rank {rank}: {e}")));
                }
            }
        }
        if running == 0 {
            return Ok(());
        }
        // Quick to notice a fast failure, cheap while a long run trains.
        std::thread::sleep(poll);
        poll = (poll * 2).min(Duration::from_millis(100));
    }
}

/// Kills and reaps the children still running; how many there were.
fn stop(children: &mut [Option<Child>]) -> usize {
    let mut n = 0;
    for child in children.iter_mut().filter_map(Option::take) {
        let mut child = child;
        if let Ok(None) = child.try_wait() {
            n += 1;
            let _ = child.kill();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<OsString> {
        vec!["-c".into(), script.into()]
    }

    #[test]
    fn all_ranks_run_with_their_variables() {
        let dir = std::env::temp_dir().join(format!("helios-spawn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!(
            "echo $RANK $LOCAL_RANK $WORLD_SIZE $EXTRA > {}/rank$RANK",
            dir.display()
        );
        spawn_ranks(
            3,
            Path::new("/bin/sh"),
            &sh(&script),
            &[("EXTRA".into(), "x".into())],
        )
        .unwrap();
        for r in 0..3 {
            let line = std::fs::read_to_string(dir.join(format!("rank{r}"))).unwrap();
            assert_eq!(line.trim(), format!("{r} {r} 3 x"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failing_rank_stops_the_others_at_once() {
        // Rank 1 fails at once; the others would sleep a minute.
        let t = Instant::now();
        let e = spawn_ranks(
            3,
            Path::new("/bin/sh"),
            &sh("if [ $RANK = 1 ]; then exit 3; fi; sleep 60"),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rank 1 failed") && e.contains("other 2 ranks"),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
        // A rank killed by a signal counts as failed too.
        let e = spawn_ranks(
            2,
            Path::new("/bin/sh"),
            &sh("if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 60"),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rank 0 failed") && e.contains("signal"), "{e}");
    }

    #[test]
    fn a_program_that_cannot_start_is_an_error() {
        let e = spawn_ranks(2, Path::new("/nonexistent/helios"), &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot start rank 0"), "{e}");
    }
}
