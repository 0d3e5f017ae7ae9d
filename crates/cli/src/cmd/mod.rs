//! One module per subcommand.

pub mod plan;
