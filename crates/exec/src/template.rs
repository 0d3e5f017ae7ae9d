//! The user's command with a `{batch}` placeholder (and, optionally, `{lr}`).

use crate::error::ExecError;

/// The placeholder replaced by the batch size in every argument.
pub const PLACEHOLDER: &str = "{batch}";
/// Environment variable that carries the batch size too.
pub const BATCH_ENV: &str = "BATCHFIT_BATCH";
/// The placeholder replaced by the trial's learning rate.
pub const LR_PLACEHOLDER: &str = "{lr}";
/// Environment variable that carries the learning rate too, when there is one.
pub const LR_ENV: &str = "BATCHFIT_LR";
/// The placeholder replaced by the trial's seed (`run --verify`).
pub const SEED_PLACEHOLDER: &str = "{seed}";
/// Environment variable that carries the seed too, when there is one.
pub const SEED_ENV: &str = "BATCHFIT_SEED";
/// Environment variable that asks the Python helper to measure gradient
/// noise every this many steps (`run`'s noise trial sets it to 1); the
/// helper's own `every=` wins.
pub const NOISE_EVERY_ENV: &str = "BATCHFIT_NOISE_EVERY";

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

    /// The argument vector for `batch` at learning rate `lr` with `seed`
    /// (`{lr}` and `{seed}` stay as they are without one: the caller refuses
    /// a command with `{lr}` and no rate first).
    pub fn render(&self, batch: u64, lr: Option<f64>, seed: Option<u64>) -> Vec<String> {
        let b = batch.to_string();
        let lr = lr.map(|l| l.to_string());
        let seed = seed.map(|s| s.to_string());
        self.argv
            .iter()
            .map(|a| {
                let mut a = a.replace(PLACEHOLDER, &b);
                if let Some(l) = &lr {
                    a = a.replace(LR_PLACEHOLDER, l);
                }
                if let Some(s) = &seed {
                    a = a.replace(SEED_PLACEHOLDER, s);
                }
                a
            })
            .collect()
    }

    /// Whether the command takes the learning rate (`{lr}` in an argument).
    pub fn takes_lr(&self) -> bool {
        self.argv.iter().any(|a| a.contains(LR_PLACEHOLDER))
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
            t.render(64, None, None),
            ["python", "train.py", "--batch-size=64", "--name", "run b64"]
        );
        assert!(!t.takes_lr());
        assert_eq!(
            t.display(),
            "python train.py --batch-size={batch} --name 'run b{batch}'"
        );
    }

    #[test]
    fn the_rate_goes_where_lr_is() {
        let t = CommandTemplate::new(
            ["python", "train.py", "--bs", "{batch}", "--lr={lr}"]
                .map(String::from)
                .to_vec(),
        )
        .unwrap();
        assert!(t.takes_lr());
        assert_eq!(
            t.render(256, Some(0.004), None),
            ["python", "train.py", "--bs", "256", "--lr=0.004"]
        );
        // Python's float() reads what Rust writes, however small.
        assert_eq!(t.render(8, Some(2.5e-7), None)[4], "--lr=0.00000025");
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
