//! `moonkv master`: the metadata server, configured by upstream config keys as flags or a file.

use anyhow::Context;
use clap::{Arg, ArgMatches, Command};
use moonkv_master::server::{self, config::flag_value, MasterConfig, CONFIG_KEYS};
use std::path::PathBuf;

/// Every master flag: `--config-path FILE` plus one kebab-case flag per config key.
#[derive(Clone, Debug, Default)]
pub struct MasterFlags {
    /// YAML or JSON file with upstream key names, applied before the flags.
    pub config_path: Option<PathBuf>,
    /// Flags given on the command line, as (config key, text).
    pub values: Vec<(String, String)>,
}

impl MasterFlags {
    /// Builds the configuration: defaults, then the file, then flags; validated.
    pub fn to_config(&self, mut config: MasterConfig) -> anyhow::Result<MasterConfig> {
        if let Some(path) = &self.config_path {
            config.load_file(path)?;
        }
        for (key, text) in &self.values {
            config
                .apply(key, &flag_value(text))
                .map_err(|e| anyhow::anyhow!("--{}: {e}", key.replace('_', "-")))?;
        }
        config.secret_from_env()?;
        config.validate()?;
        Ok(config)
    }
}

impl clap::FromArgMatches for MasterFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Self::default();
        flags.update_from_arg_matches(m)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        if let Some(path) = m.get_one::<PathBuf>("config_path") {
            self.config_path = Some(path.clone());
        }
        for key in CONFIG_KEYS {
            if let Some(v) = m.get_one::<String>(key.name) {
                self.values.push((key.name.to_string(), v.clone()));
            }
        }
        Ok(())
    }
}

impl clap::Args for MasterFlags {
    fn augment_args(cmd: Command) -> Command {
        let cmd = cmd.arg(
            Arg::new("config_path")
                .long("config-path")
                .visible_alias("config")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help("YAML or JSON config file with upstream key names (flags override it)"),
        );
        CONFIG_KEYS.iter().fold(cmd, |cmd, key| {
            let long: &'static str = Box::leak(key.name.replace('_', "-").into_boxed_str());
            cmd.arg(
                Arg::new(key.name)
                    .long(long)
                    .value_name("VALUE")
                    // `--enable-ha` alone means `--enable-ha true`; other keys refuse "true".
                    .num_args(0..=1)
                    .default_missing_value("true")
                    .help(key.help),
            )
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

/// Arguments of `moonkv master`.
#[derive(clap::Args, Debug)]
pub struct MasterArgs {
    #[command(flatten)]
    flags: MasterFlags,
}

impl MasterArgs {
    /// The validated configuration these arguments describe.
    pub fn config(&self) -> anyhow::Result<MasterConfig> {
        self.flags.to_config(MasterConfig::default())
    }
}

/// Runs the master until SIGINT or SIGTERM.
pub async fn run(config: MasterConfig) -> anyhow::Result<()> {
    let handle = server::start(config)
        .await
        .context("master failed to start")?;
    let stop = crate::shutdown_signal();
    if let Some(note) = crate::idle_poll_note() {
        tracing::info!("{note}");
    }
    crate::print_ready(&[
        ("rpc", handle.rpc_addr().to_string()),
        ("admin", handle.admin_addr().to_string()),
        ("kv_events", handle.events_endpoint().unwrap_or_default()),
    ]);
    stop.await;
    tracing::info!("shutting down");
    handle.shutdown().await;
    Ok(())
}
