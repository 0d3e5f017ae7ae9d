//! The `batchfit` command line: advise, plan, probe, noise, schedule, run, sweep.

mod cmd;
mod error;
mod options;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Counts every heap byte, so CPU peak memory is measured, not guessed
/// (and `--memory-limit` is enforced in the measuring child processes).
#[global_allocator]
static ALLOCATOR: batchfit_engine::alloc::CountingAllocator =
    batchfit_engine::alloc::CountingAllocator;

/// Which mini-batch size to train with, on the hardware you have — measured, not guessed.
#[derive(Parser)]
#[command(name = "batchfit", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The answer: which batch (and learning rate) to train with on each device, with the evidence.
    Advise(cmd::advise::AdviseArgs),
    /// Static memory and FLOP plan of a model: per layer, totals, largest batch per budget.
    Plan(cmd::plan::PlanArgs),
    /// Real timed training steps across batch sizes: throughput, peak memory, largest batch, knee.
    Probe(cmd::probe::ProbeArgs),
    /// Gradient noise scale on your data: critical batch, steps and epochs per batch, learning rates.
    Noise(cmd::noise::NoiseArgs),
    /// A batch-size schedule from the noise scale along a real run: stages, rates, predicted time (advise's flags).
    Schedule(cmd::advise::AdviseArgs),
    /// Real short trainings per batch size and seed on your data: steps to target vs prediction, quality.
    Sweep(cmd::sweep::SweepArgs),
    /// Your own training command (any framework), once per batch size in fresh processes.
    Run(cmd::run::RunArgs),
    /// Internal: measures one batch size in a fresh process (started by probe).
    #[command(name = batchfit_engine::worker::WORKER_SUBCOMMAND, hide = true)]
    Worker { request: String },
    /// Internal: ends the trials' processes when batchfit dies (started by the first trial).
    #[command(name = cmd::REAPER_SUBCOMMAND, hide = true)]
    Reaper,
}

/// The `--threads` of a command that trains in this process (`None` inside:
/// every core); `None` for the others.
fn in_process_threads(command: &Command) -> Option<Option<usize>> {
    match command {
        Command::Advise(a) | Command::Schedule(a) => Some(a.measure.threads.threads),
        Command::Noise(a) => Some(a.noise.threads.threads),
        Command::Sweep(a) => Some(a.threads.threads),
        _ => None,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Worker { .. } | Command::Reaper)
        && let Err(e) = cmd::end_trials_with_batchfit()
    {
        eprintln!("error: {}", e.report());
        return ExitCode::from(e.exit_code());
    }
    if let Some(threads) = in_process_threads(&cli.command) {
        // This thread joins the pool, as the probe's workers' do: a training
        // step in this process (noise runs, rate checks, sweeps) then pays no
        // hand-off per kernel, and is timed as the probe timed it (sweeps at
        // batch 32 of an MNIST MLP took 1.5 ms a step more from outside it).
        // The main thread lives as long as the process, which the pool needs.
        let _ = batchfit_engine::set_threads(threads.unwrap_or(0));
    }
    let result = match cli.command {
        Command::Advise(args) => cmd::advise::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Probe(args) => cmd::probe::run(args),
        Command::Noise(args) => cmd::noise::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Schedule(args) => cmd::advise::run_schedule(args),
        Command::Sweep(args) => cmd::sweep::run(args),
        Command::Reaper => cmd::reap(),
        Command::Worker { request } => batchfit_engine::worker::serve(&request).map_err(|e| {
            batchfit_pipeline::Error::failure("the measuring worker failed", e).into()
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = e.exit_code();
            if code != 0 {
                eprintln!("error: {}", e.report());
            }
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;
    use std::collections::BTreeMap;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// A flag that several commands take is one definition: the same help, default,
    /// value names and possible values wherever it appears (they are flattened from
    /// the groups in `options.rs`).
    #[test]
    fn a_flag_means_the_same_in_every_command() {
        let cli = Cli::command();
        let mut seen: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut shared = 0;
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                let definition = format!(
                    "help {:?}; defaults {:?}; names {:?}; values {:?}; delimiter {:?}; action {:?}",
                    arg.get_help().map(|h| h.to_string()),
                    arg.get_default_values(),
                    arg.get_value_names(),
                    arg.get_possible_values()
                        .iter()
                        .map(|v| v.get_name().to_string())
                        .collect::<Vec<_>>(),
                    arg.get_value_delimiter(),
                    arg.get_action(),
                );
                match seen.get(long) {
                    Some((first, earlier)) => {
                        shared += 1;
                        assert_eq!(
                            earlier,
                            &definition,
                            "--{long} differs between `{first}` and `{}`",
                            sub.get_name()
                        );
                    }
                    None => {
                        seen.insert(long.to_string(), (sub.get_name().to_string(), definition));
                    }
                }
            }
        }
        // --optimizer, --threads, --ref-batch, --json, ... are shared: the check checks something.
        assert!(shared > 20, "{shared} shared flags");
    }
}
