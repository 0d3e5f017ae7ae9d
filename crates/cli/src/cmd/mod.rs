//! One module per subcommand.

pub mod noise;
pub mod plan;
pub mod probe;
