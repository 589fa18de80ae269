//! `metalguard-agent generate-assets DIR`: the man page and shell completions, generated from
//! the CLI definition so they never drift from it. The packaging script calls it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

/// Arguments of the hidden `generate-assets` subcommand.
#[derive(Debug, Args)]
pub(crate) struct AssetArgs {
    /// Output directory (created).
    dir: PathBuf,
}

/// Writes `metalguard-agent.1` and completions for bash, zsh and fish into the directory.
pub(crate) fn generate<C: CommandFactory>(args: &AssetArgs) -> ExitCode {
    match write_assets::<C>(&args.dir) {
        Ok(files) => {
            for file in files {
                println!("{}", file.display());
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("generating assets in {}: {err}", args.dir.display());
            ExitCode::FAILURE
        }
    }
}

fn write_assets<C: CommandFactory>(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let command = C::command();
    let man = dir.join("metalguard-agent.1");
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    std::fs::write(&man, page)?;
    written.push(man);
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut command = command.clone();
        let path = clap_complete::generate_to(shell, &mut command, "metalguard-agent", dir)?;
        written.push(path);
    }
    Ok(written)
}
