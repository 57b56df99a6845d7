//! What droverctl says about itself without a replica: shell completion
//! scripts and man pages, both generated from the same clap definition the
//! parser uses, so they cannot drift from the flags.

use std::path::Path;

/// The completion script for `shell`, to be sourced (`source <(droverctl
/// completion bash)`) or installed.
pub fn completion(command: &mut clap::Command, shell: clap_complete::Shell) -> String {
    // Into a buffer, not straight to standard output: clap_complete panics
    // on a write error, and a reader may close the pipe early.
    let mut script = Vec::new();
    clap_complete::generate(shell, command, "droverctl", &mut script);
    String::from_utf8_lossy(&script).into_owned()
}

/// Writes `droverctl.1` and one page per subcommand (`droverctl-cluster.1`,
/// `droverctl-cluster-create.1`, ...) into `dir`, creating it; returns the
/// pages written.
pub fn man_pages(command: clap::Command, dir: &Path) -> std::io::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    write_page(command, "droverctl", dir, &mut written)?;
    Ok(written)
}

/// The page of `command`, named `name`, then those of its subcommands.
fn write_page(
    command: clap::Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<String>,
) -> std::io::Result<()> {
    // clap_mangen titles a page by the command's own name; a subcommand's
    // page must carry its full path ("droverctl-cluster-create") instead.
    let command = command.display_name(name).bin_name(name.replace('-', " "));
    let file = format!("{name}.1");
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    std::fs::write(dir.join(&file), page)?;
    written.push(file);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub_name = format!("{name}-{}", sub.get_name());
        write_page(sub.clone(), &sub_name, dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_shell_completes_every_subcommand() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let script = completion(&mut crate::Cli::command(), shell);
            for word in [
                "cluster", "upgrade", "task", "members", "endpoint", "rollout", "approve",
            ] {
                assert!(script.contains(word), "{shell}: {word} missing");
            }
        }
    }

    #[test]
    fn man_pages_cover_every_command_under_its_full_name() {
        let dir = std::env::temp_dir().join(format!("droverctl-man-{}", std::process::id()));
        let pages = man_pages(crate::Cli::command(), &dir).unwrap();
        for page in [
            "droverctl.1",
            "droverctl-cluster-create.1",
            "droverctl-op-wait.1",
            "droverctl-rollout-create.1",
        ] {
            assert!(pages.iter().any(|p| p == page), "{page} in {pages:?}");
        }
        let create = std::fs::read_to_string(dir.join("droverctl-cluster-create.1")).unwrap();
        assert!(create.contains("droverctl cluster create"), "{create}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
