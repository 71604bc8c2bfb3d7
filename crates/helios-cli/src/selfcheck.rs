//! `helios selfcheck`: every element-wise op on the chosen device against the CPU reference,
//! on random inputs and on IEEE special values. Exits non-zero on any mismatch.

use std::time::Instant;

use clap::Args;
use helios::Device;

use crate::CliResult;

#[derive(Args, Debug)]
pub struct SelfcheckArgs {
    /// Element counts to test each op at.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 3, 4, 1023, 65536, (1 << 20) + 3])]
    sizes: Vec<usize>,
}

pub fn run(args: &SelfcheckArgs) -> CliResult {
    let device = Device::from_env()?;
    println!(
        "element-wise self-check on {} (sizes {:?})",
        device.name(),
        args.sizes
    );
    let start = Instant::now();
    let outcomes = helios::selfcheck::run(&device, &args.sizes)?;
    let mut failed = 0;
    for o in &outcomes {
        match &o.failure {
            None => println!("  ok    {}", o.case),
            Some(why) => {
                failed += 1;
                println!("  FAIL  {why}");
            }
        }
    }
    let messages = device.validation_messages();
    for m in &messages {
        println!("  validation: {m}");
    }
    println!(
        "{} of {} cases passed in {:.2} s{}",
        outcomes.len() - failed,
        outcomes.len(),
        start.elapsed().as_secs_f64(),
        if messages.is_empty() {
            String::new()
        } else {
            format!(", {} validation messages", messages.len())
        }
    );
    if failed > 0 || !messages.is_empty() {
        return Err(format!("self-check failed on {}", device.name()).into());
    }
    Ok(())
}
