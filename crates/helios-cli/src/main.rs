//! `helios`: the command-line front end. This file only parses arguments and dispatches;
//! each subcommand lives in its own module with an `Args` struct and a `run` function
//! (`train`, `generate`, `info`, `selfcheck`, `field`, and `bench` with a file per suite;
//! `corpus` and `plot` serve `train`), and every failure comes back here as a value, is
//! printed as `error: ...` and exits with 1.

mod bench;
mod corpus;
mod field;
mod generate;
mod info;
mod plot;
mod selfcheck;
mod train;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Errors from any subcommand; each crate's error type converts into it.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Parser)]
#[command(
    name = "helios",
    version,
    about = "Helios: a tensor engine on Vulkan compute"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the Vulkan devices, their capabilities, and the one Helios would use.
    Info(info::InfoArgs),
    /// Check every element-wise op on the chosen device against the CPU reference.
    Selfcheck(selfcheck::SelfcheckArgs),
    /// BLS12-381 base-field arithmetic on the GPU (`helios field bench`).
    Field(field::FieldArgs),
    /// Benchmarks: dispatch overhead and memory bandwidth, optionally beside PyTorch.
    Bench(bench::BenchArgs),
    /// Train a GPT-2 (the tiny preset on the bundled Shakespeare by default) and sample from it.
    Train(Box<train::TrainArgs>),
    /// Generate text from a checkpoint or Hugging Face GPT-2 weights.
    Generate(generate::GenerateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(args) => info::run(&args),
        Command::Selfcheck(args) => selfcheck::run(&args),
        Command::Field(args) => field::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Generate(args) => generate::run(&args),
    };
    // Candidates still compiling for tuning on real work: let the one compiling finish
    // before the driver unloads.
    helios::stop_background_tuning();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
