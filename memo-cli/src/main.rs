//! The `memo` command line: a small dispatcher over one module per subcommand.
//!
//! Exit codes are listed in [`exit`]; every failure is one line on standard error starting with
//! `memo:`.

mod checked;
mod config;
mod device;
pub mod exit;
mod human;
mod inspect;
mod picture;
mod plan;
mod profile;
mod progress;
mod recall;
mod solve;
mod train;
mod units;

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};

use exit::Failure;

/// MEMO's memory planner: verified arena placements for long-context LLM training.
#[derive(Debug, Parser)]
#[command(name = "memo", version, after_help = exit::HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Place the buffers of a memory request trace in one arena with the lowest peak
    #[command(long_about = solve::LONG_ABOUT)]
    Solve(solve::SolveArgs),
    /// Plan one training step per GPU for each strategy (memo, full-recompute, full-swap, keep-all)
    #[command(long_about = plan::LONG_ABOUT)]
    Plan(Box<plan::PlanArgs>),
    /// Verify a plan file with the independent checker; list every violation
    Check(inspect::CheckArgs),
    /// Summarise a plan file: sizes, buffers by kind, instructions per stream, simulated step
    Show(inspect::ShowArgs),
    /// Train a GPT through a verified plan on a backend (cpu, cuda, hip)
    #[command(long_about = train::LONG_ABOUT)]
    Train(Box<train::TrainArgs>),
    /// Measure a device (copy bandwidth, one layer's forward time) and write a [machine] TOML
    #[command(long_about = profile::LONG_ABOUT)]
    Profile(Box<profile::ProfileArgs>),
    /// Print a shell completion script for memo (bash, zsh or fish) on standard output
    #[command(long_about = COMPLETIONS_ABOUT, after_help = exit::HELP)]
    Completions(CompletionsArgs),
}

const COMPLETIONS_ABOUT: &str = "\
Print a shell completion script for memo (its subcommands, options and their values) on standard
output. Load it in the shell, or install it where the shell looks:

  source <(memo completions bash)                         # bash, this session
  memo completions bash > ~/.local/share/bash-completion/completions/memo
  memo completions zsh > \"${fpath[1]}/_memo\"              # zsh, then restart it
  memo completions fish > ~/.config/fish/completions/memo.fish";

/// The shells `memo completions` writes for.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// The arguments of `memo completions`.
#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell: bash, zsh or fish
    #[arg(value_name = "SHELL", value_enum)]
    shell: CompletionShell,
}

/// Writes the completion script of `memo` for `args.shell` on standard output.
fn completions(args: &CompletionsArgs) -> Result<(), Failure> {
    let shell = match args.shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "memo", &mut script);
    std::io::stdout().lock().write_all(&script).map_err(|e| {
        Failure::new(exit::IO_ERROR, format!("cannot write the completion script to standard output: {e}"))
    })
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => return clap_exit(&error, &args),
    };
    let result = match &cli.command {
        Command::Solve(solve_args) => solve::run(solve_args),
        Command::Plan(plan_args) => plan::run(plan_args),
        Command::Check(check_args) => inspect::run_check(check_args),
        Command::Show(show_args) => inspect::run_show(show_args),
        Command::Train(train_args) => train::run(train_args),
        Command::Profile(profile_args) => profile::run(profile_args),
        Command::Completions(completions_args) => completions(completions_args),
    };
    match result {
        Ok(()) => ExitCode::from(exit::SUCCESS),
        Err(failure) => failure.report(),
    }
}

/// `--help` and `--version` print in full and succeed; every other clap error becomes a one-line
/// usage error (exit 2) that points at the right `--help`.
fn clap_exit(error: &clap::Error, args: &[OsString]) -> ExitCode {
    if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let mut text = error.render().to_string();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        return match std::io::stdout().lock().write_all(text.as_bytes()) {
            Ok(()) => ExitCode::from(exit::SUCCESS),
            Err(e) => Failure::new(exit::IO_ERROR, format!("cannot write the help to standard output: {e}")).report(),
        };
    }
    let command = Cli::command();
    let subcommand =
        args.iter().skip(1).filter_map(|a| a.to_str()).find(|a| command.get_subcommands().any(|s| s.get_name() == *a));
    let help = match subcommand {
        Some(name) => format!("memo {name} --help"),
        None => "memo --help".to_string(),
    };
    let what = match error.kind() {
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            "no command given".to_string()
        }
        _ => {
            // The first paragraph of clap's message, on one line, without its `error: ` label.
            let rendered = error.render().to_string();
            let paragraph: Vec<&str> = rendered.lines().map(str::trim).take_while(|l| !l.is_empty()).collect();
            let joined = paragraph.join(" ");
            joined.strip_prefix("error: ").unwrap_or(&joined).to_string()
        }
    };
    Failure::new(exit::BAD_INPUT, format!("{what}; see `{help}`")).report()
}
