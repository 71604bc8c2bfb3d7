//! What helios-dist reads from its environment (documented in `docs/ENVIRONMENT.md`): its
//! `HELIOS_*` switches, read here and nowhere else, and which rank this process is, read from
//! whatever started it: `helios train --nproc N` and `torchrun` set `RANK`, `WORLD_SIZE` and
//! `LOCAL_RANK`; MPICH's `mpiexec` sets `PMI_RANK` and `PMI_SIZE`, Open MPI's
//! `OMPI_COMM_WORLD_*`; Slurm's `srun` `SLURM_PROCID`, `SLURM_NTASKS` and `SLURM_LOCALID`.

use std::time::Duration;

use crate::{Error, Result};

/// `HELIOS_DEVICE` set (to more than blanks): the user chose the device, and every rank
/// takes it.
pub(crate) fn device_chosen() -> bool {
    std::env::var("HELIOS_DEVICE").is_ok_and(|s| !s.trim().is_empty())
}

/// `HELIOS_DIST_TIMEOUT=<seconds>`: how long a rank waits for the others to join, or in one
/// collective call; `None` when unset, an error when not a number of seconds above 0.
pub(crate) fn dist_timeout() -> Result<Option<Duration>> {
    match std::env::var("HELIOS_DIST_TIMEOUT") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(s) if s > 0 => Ok(Some(Duration::from_secs(s))),
            _ => Err(Error::Environment(format!(
                "HELIOS_DIST_TIMEOUT={v:?} is not a number of seconds above 0"
            ))),
        },
    }
}

/// What started this process, which decides how the ranks find each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// Nothing: a run of one.
    None,
    /// An MPI launcher (`mpiexec`): MPI connects the ranks.
    Mpi,
    /// `helios train --nproc`, `torchrun` or `srun` without MPI: NCCL's own bootstrap
    /// (`NCCL_COMM_ID=host:port`) connects them.
    Env,
}

/// This process's place in the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rank {
    /// 0-based, below `world`.
    pub rank: usize,
    /// Processes in the run.
    pub world: usize,
    /// Rank among the processes on this host: which GPU to take.
    pub local_rank: usize,
    pub launcher: Launcher,
}

impl Rank {
    /// A run of one process.
    pub const SINGLE: Rank = Rank {
        rank: 0,
        world: 1,
        local_rank: 0,
        launcher: Launcher::None,
    };

    /// Rank 0 writes the checkpoints, logs and plots and prints the progress.
    pub fn is_first(&self) -> bool {
        self.rank == 0
    }

    /// This process's rank from its environment.
    pub fn from_env() -> Result<Rank> {
        Rank::from_lookup(|k| std::env::var(k).ok())
    }

    /// `from_env` over any lookup (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Rank> {
        let sources: [(Launcher, &str, &str, &[&str]); 4] = [
            (Launcher::Mpi, "PMI_RANK", "PMI_SIZE", &["MPI_LOCALRANKID"]),
            (
                Launcher::Mpi,
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                &["OMPI_COMM_WORLD_LOCAL_RANK"],
            ),
            (Launcher::Env, "RANK", "WORLD_SIZE", &["LOCAL_RANK"]),
            (
                Launcher::Env,
                "SLURM_PROCID",
                "SLURM_NTASKS",
                &["SLURM_LOCALID"],
            ),
        ];
        for (launcher, rank_var, world_var, local_vars) in sources {
            let (Some(rank), Some(world)) = (get(rank_var), get(world_var)) else {
                continue;
            };
            let number = |var: &str, value: &str| {
                value.trim().parse::<usize>().map_err(|_| {
                    Error::Environment(format!(
                        "{var}={value:?} is not a number; the launcher set it wrong, or unset it \
                         to run a single process"
                    ))
                })
            };
            let (rank, world) = (number(rank_var, &rank)?, number(world_var, &world)?);
            if world == 0 || rank >= world {
                return Err(Error::Environment(format!(
                    "{rank_var}={rank} and {world_var}={world} cannot both be right: a rank is \
                     below the number of processes"
                )));
            }
            // Without a local rank, one process per host is the only safe guess.
            let local_rank = match local_vars.iter().find_map(|v| get(v).map(|x| (v, x))) {
                Some((var, value)) => number(var, &value)?,
                None if world == 1 => 0,
                None => rank,
            };
            let launcher = if world == 1 { Launcher::None } else { launcher };
            return Ok(Rank {
                rank,
                world,
                local_rank,
                launcher,
            });
        }
        Ok(Rank::SINGLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(vars: &[(&str, &str)]) -> Result<Rank> {
        Rank::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn reads_each_launcher_and_refuses_nonsense() {
        assert_eq!(rank(&[]).unwrap(), Rank::SINGLE);
        let torchrun = rank(&[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")]).unwrap();
        assert_eq!(
            (
                torchrun.rank,
                torchrun.world,
                torchrun.local_rank,
                torchrun.launcher
            ),
            (3, 8, 1, Launcher::Env)
        );
        // MPI's variables win over a stray RANK: mpiexec started this process.
        let mpi = rank(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "1"),
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
        ])
        .unwrap();
        assert_eq!((mpi.rank, mpi.world, mpi.launcher), (1, 2, Launcher::Mpi));
        let slurm = rank(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "6")]).unwrap();
        assert_eq!((slurm.rank, slurm.local_rank), (5, 5));
        // A world of one is a single run, whatever started it.
        let one = rank(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]).unwrap();
        assert_eq!(one.launcher, Launcher::None);
        for bad in [
            &[("RANK", "2"), ("WORLD_SIZE", "2")][..],
            &[("RANK", "x"), ("WORLD_SIZE", "2")],
            &[("RANK", "0"), ("WORLD_SIZE", "0")],
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "-1")],
        ] {
            let e = rank(bad).unwrap_err().to_string();
            assert!(e.contains("RANK") || e.contains("LOCAL_RANK"), "{e}");
        }
    }
}
