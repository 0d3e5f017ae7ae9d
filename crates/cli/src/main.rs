//! The `batchfit` command line: plan, probe, noise, advise.

mod cmd;
mod error;
mod options;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Which mini-batch size to train with, on the hardware you have — measured, not guessed.
#[derive(Parser)]
#[command(name = "batchfit", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Static memory and FLOP plan of a model: per layer, totals, largest batch per budget.
    Plan(cmd::plan::PlanArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(args) => cmd::plan::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
