//! `deadbolt server --config FILE`: any server flag from a TOML file.
//!
//! Every key is a `deadbolt server` flag's long name (`listen`,
//! `election-timeout` or `election_timeout`, ...) with the value the flag
//! takes: `listen = "10.0.0.1:7070"`, `snapshot-every = 10000`,
//! `election-timeout = "300ms"`, `join = true`. The precedence is the usual
//! one (Consul's, viper's): a flag on the command line wins over its
//! `DEADBOLT_*` environment variable, which wins over the file, which wins
//! over the default. An unknown key or a bad value is refused at start,
//! naming the file, the line and the key.
//!
//! Why through clap rather than a second, serde-shaped copy of the flags:
//! the file's values go through the very parsers, checks and conflicts the
//! command line has, so the two can never disagree.

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// A problem with the file, in words for the operator.
pub type ConfigError = String;

/// The command line with a config file's settings added.
pub struct WithFile {
    pub argv: Vec<OsString>,
    /// The file, and where in `argv` its flags begin.
    pub file: Option<(PathBuf, usize)>,
}

/// `argv` with the file's settings added as flags, for whatever the command
/// line and the environment left at its default; `argv` as it is without
/// `--config`. `command` is the whole CLI.
pub fn with_config_file(command: &Command, argv: Vec<OsString>) -> Result<WithFile, ConfigError> {
    let unchanged = |argv| Ok(WithFile { argv, file: None });
    // Parsed once to find --config and what was given otherwise; the caller
    // parses the result again and reports any other mistake as usual.
    let Ok(matches) = command.clone().try_get_matches_from(&argv) else {
        return unchanged(argv);
    };
    let Some(("server", server)) = matches.subcommand() else {
        return unchanged(argv);
    };
    let Some(path) = server.get_one::<PathBuf>("config").cloned() else {
        return unchanged(argv);
    };
    let server_command = command
        .find_subcommand("server")
        .expect("the CLI has a server command");
    let extra = file_flags(server_command, server, &path)?;
    let mut argv = argv;
    let start = argv.len();
    argv.extend(extra);
    Ok(WithFile {
        argv,
        file: Some((path, start)),
    })
}

/// The flags the file at `path` adds.
fn file_flags(
    command: &Command,
    given: &ArgMatches,
    path: &Path,
) -> Result<Vec<OsString>, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read the config file {}: {err}", path.display()))?;
    let table: toml::Table = text
        .parse()
        .map_err(|err: toml::de::Error| format!("{}: {err}", path.display()))?;
    let mut flags = Vec::new();
    for (key, value) in &table {
        let at = |problem: String| {
            format!(
                "{}, line {}, key {key:?}: {problem}",
                path.display(),
                line_of(&text, key)
            )
        };
        let long = key.replace('_', "-");
        let arg = command
            .get_arguments()
            .find(|arg| arg.get_long() == Some(long.as_str()) && long != "config")
            .ok_or_else(|| {
                at(format!(
                    "no such setting (the keys are `deadbolt server` flags: {})",
                    known_keys(command)
                ))
            })?;
        let source = given.value_source(arg.get_id().as_str());
        if matches!(
            source,
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let takes_value = arg.get_action().takes_values();
        match value {
            toml::Value::Boolean(set) if !takes_value => {
                if *set {
                    flags.push(format!("--{long}").into());
                }
            }
            _ if !takes_value => return Err(at("takes true or false".into())),
            toml::Value::String(text) => flags.extend([format!("--{long}").into(), text.into()]),
            toml::Value::Integer(n) => {
                flags.extend([format!("--{long}").into(), n.to_string().into()])
            }
            other => {
                return Err(at(format!(
                    "takes a string or a number, not {}",
                    other.type_str()
                )))
            }
        }
    }
    Ok(flags)
}

/// The line `key` is set on, for messages; 0 if it cannot be found.
fn line_of(text: &str, key: &str) -> usize {
    text.lines()
        .position(|line| {
            let line = line.trim_start().trim_start_matches('"');
            line.strip_prefix(key).is_some_and(|rest| {
                rest.trim_start()
                    .trim_start_matches('"')
                    .trim_start()
                    .starts_with('=')
            })
        })
        .map_or(0, |index| index + 1)
}

fn known_keys(command: &Command) -> String {
    command
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .filter(|long| *long != "config" && *long != "help")
        .collect::<Vec<_>>()
        .join(", ")
}

/// If a clap error is about a flag the file set: the message, naming the
/// file, the line and the key.
pub fn blame(err: &clap::Error, with: &WithFile) -> Option<String> {
    let (path, start) = with.file.as_ref()?;
    let invalid = err.get(clap::error::ContextKind::InvalidArg)?.to_string();
    let flag = invalid.split_whitespace().next()?.to_owned();
    if !with.argv[*start..]
        .iter()
        .any(|arg| arg.to_str() == Some(flag.as_str()))
    {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let name = flag.trim_start_matches("--");
    let key = [name.to_owned(), name.replace('-', "_")]
        .into_iter()
        .find(|key| line_of(&text, key) > 0)?;
    let rendered = err.render().to_string();
    let problem = rendered.lines().next()?.trim_start_matches("error: ");
    Some(format!(
        "{}, line {}, key {key:?}: {problem}",
        path.display(),
        line_of(&text, &key)
    ))
}
