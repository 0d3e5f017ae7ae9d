//! One module per subcommand.

pub mod advise;
pub mod noise;
pub mod plan;
pub mod probe;
pub mod run;
pub mod sweep;
