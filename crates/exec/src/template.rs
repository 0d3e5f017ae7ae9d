//! The user's command with a `{batch}` placeholder.

use crate::error::ExecError;

/// The placeholder replaced by the batch size in every argument.
pub const PLACEHOLDER: &str = "{batch}";
/// Environment variable that carries the batch size too.
pub const BATCH_ENV: &str = "BATCHFIT_BATCH";

/// A command line to run once per batch size.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandTemplate {
    argv: Vec<String>,
}

impl CommandTemplate {
    /// Checks the command before anything runs: it must have a program and
    /// say where the batch size goes.
    pub fn new(argv: Vec<String>) -> Result<CommandTemplate, ExecError> {
        if argv.is_empty() {
            return Err(ExecError::NoCommand);
        }
        if !argv.iter().any(|a| a.contains(PLACEHOLDER)) {
            return Err(ExecError::NoPlaceholder {
                command: argv.join(" "),
            });
        }
        Ok(CommandTemplate { argv })
    }

    /// The argument vector for `batch`.
    pub fn render(&self, batch: u64) -> Vec<String> {
        let b = batch.to_string();
        self.argv
            .iter()
            .map(|a| a.replace(PLACEHOLDER, &b))
            .collect()
    }

    /// The arguments, placeholders unreplaced.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The template as one line, for reports.
    pub fn display(&self) -> String {
        Self::display_argv(&self.argv)
    }

    /// Any argument vector as one line, arguments with spaces quoted.
    pub fn display_argv(argv: &[String]) -> String {
        argv.iter()
            .map(|a| {
                if a.is_empty() || a.contains(char::is_whitespace) {
                    format!("'{a}'")
                } else {
                    a.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_every_placeholder() {
        let t = CommandTemplate::new(vec![
            "python".into(),
            "train.py".into(),
            "--batch-size={batch}".into(),
            "--name".into(),
            "run b{batch}".into(),
        ])
        .unwrap();
        assert_eq!(
            t.render(64),
            ["python", "train.py", "--batch-size=64", "--name", "run b64"]
        );
        assert_eq!(
            t.display(),
            "python train.py --batch-size={batch} --name 'run b{batch}'"
        );
    }

    #[test]
    fn a_command_without_placeholder_is_refused() {
        let e = CommandTemplate::new(vec!["python".into(), "train.py".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("{batch}") && e.contains("python train.py"),
            "{e}"
        );
        assert!(CommandTemplate::new(vec![]).is_err());
    }
}
