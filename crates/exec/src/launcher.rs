//! Several GPUs: the user's command wrapped in a data-parallel launcher
//! (torchrun, DeepSpeed's `deepspeed`), which starts one copy per device
//! with `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ... set. `{batch}`
//! stays the per-device micro-batch.

use crate::error::ExecError;

/// Variables a launcher sets for each worker; removed from the launcher's own
/// environment, so that only the workers carry a rank (a batchfit started
/// inside a scheduler's job would otherwise pass its own `RANK` down and the
/// launcher process would be taken for a rank).
pub const RANK_VARS: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
];

/// Which launcher: they spell the same settings differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum LauncherKind {
    /// PyTorch's `torchrun` (torch.distributed.run).
    #[cfg_attr(feature = "clap", value(name = "torchrun"))]
    Torchrun,
    /// DeepSpeed's `deepspeed` runner.
    #[cfg_attr(feature = "clap", value(name = "deepspeed"))]
    Deepspeed,
}

impl LauncherKind {
    /// The program's usual name, looked up on PATH.
    pub fn program(self) -> &'static str {
        match self {
            LauncherKind::Torchrun => "torchrun",
            LauncherKind::Deepspeed => "deepspeed",
        }
    }
}

/// A launcher and the topology it is asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Launcher {
    /// Which launcher, for its spelling of the flags.
    pub kind: LauncherKind,
    /// What to run: [`LauncherKind::program`] or the user's `--launcher-cmd`.
    pub program: String,
    /// Workers (devices) on this node.
    pub nproc_per_node: u32,
    /// Nodes taking part, each running batchfit with the same flags.
    pub nnodes: u32,
    /// This node's place among the nodes.
    pub node_rank: u32,
    /// Rendezvous host (node 0); the launcher's default when `None`.
    pub master_addr: Option<String>,
    /// Rendezvous port; the launcher's default (29500) when `None`.
    pub master_port: Option<u16>,
}

impl Launcher {
    /// `nproc_per_node` workers on one node, the launcher found on PATH.
    pub fn new(kind: LauncherKind, nproc_per_node: u32) -> Launcher {
        Launcher {
            kind,
            program: kind.program().to_string(),
            nproc_per_node,
            nnodes: 1,
            node_rank: 0,
            master_addr: None,
            master_port: None,
        }
    }

    /// Workers on all nodes together.
    pub fn world_size(&self) -> u32 {
        self.nproc_per_node.saturating_mul(self.nnodes)
    }

    /// Checks the topology before anything runs.
    pub fn check(&self) -> Result<(), ExecError> {
        let bad = |why: String| Err(ExecError::Launcher(why));
        if self.nproc_per_node == 0 || self.nnodes == 0 {
            return bad("--nproc-per-node and --nnodes must be at least 1".into());
        }
        if self.node_rank >= self.nnodes {
            return bad(format!(
                "--node-rank {} is not below --nnodes {}",
                self.node_rank, self.nnodes
            ));
        }
        if self.nnodes > 1 {
            if self.kind == LauncherKind::Deepspeed {
                return bad("a multi-node DeepSpeed launch reads its nodes from a hostfile, which batchfit does not write; use --launcher torchrun on each node".into());
            }
            if self.master_addr.is_none() {
                return bad(format!(
                    "--nnodes {} needs --master-addr (the address of node 0, which every node must reach)",
                    self.nnodes
                ));
            }
        }
        Ok(())
    }

    /// The launcher's command line around the user's `argv`. A launcher runs
    /// a Python script itself (`torchrun train.py`, not `torchrun python
    /// train.py`), so a leading bare `python`/`python3` is dropped and `-m
    /// MODULE` becomes the launcher's module flag; any other program, an
    /// interpreter given by path or with its own flags (`python -u`) is run
    /// as it is through the launcher's no-Python flag.
    pub fn wrap(&self, argv: &[String]) -> Vec<String> {
        let torchrun = self.kind == LauncherKind::Torchrun;
        let flag = |dashed: &str| {
            if torchrun {
                format!("--{dashed}")
            } else {
                format!("--{}", dashed.replace('-', "_"))
            }
        };
        let mut out = vec![self.program.clone()];
        if torchrun {
            out.extend([flag("nproc-per-node"), self.nproc_per_node.to_string()]);
        } else {
            out.extend(["--num_gpus".to_string(), self.nproc_per_node.to_string()]);
        }
        if self.nnodes > 1 {
            let nodes = if torchrun { "nnodes" } else { "num-nodes" };
            out.extend([flag(nodes), self.nnodes.to_string()]);
            out.extend([flag("node-rank"), self.node_rank.to_string()]);
        }
        if let Some(a) = &self.master_addr {
            out.extend([flag("master-addr"), a.clone()]);
        }
        if let Some(p) = self.master_port {
            out.extend([flag("master-port"), p.to_string()]);
        }
        match split_python(argv) {
            PythonCommand::Script(rest) => out.extend(rest.iter().cloned()),
            PythonCommand::Module(rest) => {
                out.push(if torchrun {
                    "-m".into()
                } else {
                    "--module".into()
                });
                out.extend(rest.iter().cloned());
            }
            PythonCommand::Other => {
                out.push(flag("no-python"));
                out.extend(argv.iter().cloned());
            }
        }
        out
    }
}

/// How the user's command starts.
enum PythonCommand<'a> {
    /// `python SCRIPT ARGS`: SCRIPT ARGS.
    Script(&'a [String]),
    /// `python -m MODULE ARGS`: MODULE ARGS.
    Module(&'a [String]),
    /// Anything else.
    Other,
}

fn split_python(argv: &[String]) -> PythonCommand<'_> {
    // Only a bare name: an interpreter given by path (a virtual environment's)
    // is kept, since the launcher would otherwise use its own.
    let is_python = argv.first().is_some_and(|p| {
        p.strip_prefix("python")
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
    });
    if !is_python {
        return PythonCommand::Other;
    }
    match argv.get(1).map(String::as_str) {
        Some("-m") if argv.len() > 2 => PythonCommand::Module(&argv[2..]),
        Some(a) if !a.starts_with('-') => PythonCommand::Script(&argv[1..]),
        _ => PythonCommand::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn torchrun_takes_the_script_not_python() {
        let l = Launcher::new(LauncherKind::Torchrun, 2);
        assert_eq!(
            l.wrap(&v("python train.py --batch-size 64")).join(" "),
            "torchrun --nproc-per-node 2 train.py --batch-size 64"
        );
        assert_eq!(
            l.wrap(&v("python3.11 -m pkg.train --bs 8")).join(" "),
            "torchrun --nproc-per-node 2 -m pkg.train --bs 8"
        );
        assert_eq!(
            l.wrap(&v("python -u train.py 8")).join(" "),
            "torchrun --nproc-per-node 2 --no-python python -u train.py 8"
        );
        assert_eq!(
            l.wrap(&v("/venv/bin/python train.py 8")).join(" "),
            "torchrun --nproc-per-node 2 --no-python /venv/bin/python train.py 8"
        );
        assert_eq!(
            l.wrap(&v("sh fake.sh 8")).join(" "),
            "torchrun --nproc-per-node 2 --no-python sh fake.sh 8"
        );
        assert_eq!(
            l.wrap(&v("pythonista x 8")).join(" "),
            "torchrun --nproc-per-node 2 --no-python pythonista x 8"
        );
    }

    #[test]
    fn several_nodes_and_deepspeed_spellings() {
        let l = Launcher {
            nnodes: 2,
            node_rank: 1,
            master_addr: Some("10.0.0.1".into()),
            master_port: Some(29600),
            ..Launcher::new(LauncherKind::Torchrun, 4)
        };
        assert_eq!(l.world_size(), 8);
        assert!(l.check().is_ok());
        assert_eq!(
            l.wrap(&v("python train.py 8")).join(" "),
            "torchrun --nproc-per-node 4 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29600 train.py 8"
        );
        let d = Launcher {
            master_port: Some(29600),
            ..Launcher::new(LauncherKind::Deepspeed, 2)
        };
        assert_eq!(
            d.wrap(&v("python -m pkg.train 8")).join(" "),
            "deepspeed --num_gpus 2 --master_port 29600 --module pkg.train 8"
        );
        assert_eq!(
            d.wrap(&v("./train.sh 8")).join(" "),
            "deepspeed --num_gpus 2 --master_port 29600 --no_python ./train.sh 8"
        );
    }

    #[test]
    fn impossible_topologies_are_refused() {
        let t = Launcher::new(LauncherKind::Torchrun, 2);
        assert!(
            Launcher {
                nproc_per_node: 0,
                ..t.clone()
            }
            .check()
            .is_err()
        );
        assert!(
            Launcher {
                nnodes: 2,
                node_rank: 2,
                ..t.clone()
            }
            .check()
            .is_err()
        );
        let e = Launcher {
            nnodes: 2,
            ..t.clone()
        }
        .check()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--master-addr"), "{e}");
        let d = Launcher {
            nnodes: 2,
            master_addr: Some("a".into()),
            ..Launcher::new(LauncherKind::Deepspeed, 2)
        };
        assert!(d.check().unwrap_err().to_string().contains("hostfile"));
    }
}
