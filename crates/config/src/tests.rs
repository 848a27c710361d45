use std::collections::HashMap;

use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[test]
fn defaults_parse() {
    let config = load_str(None, &HashMap::new()).expect("defaults are valid");
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:50051");
    assert!(config.telemetry.otlp_endpoint.is_none());
    assert!(config.credentials.is_empty());
}

#[test]
fn file_overrides_defaults_and_env_overrides_file() {
    let file = "[server]\nlisten = \"127.0.0.1:7000\"\nmax_call_depth = 5\n";
    let config = load_str(Some(("f.toml", file)), &env(&[])).unwrap();
    assert_eq!(config.server.listen.port(), 7000);
    assert_eq!(config.server.max_call_depth, 5);
    assert_eq!(config.server.max_watches.get(), 1024, "untouched keys keep their defaults");

    let config = load_str(
        Some(("f.toml", file)),
        &env(&[("TOOLMESH__SERVER__MAX_CALL_DEPTH", "2"), ("TOOLMESH__TELEMETRY__LOG", "debug")]),
    )
    .unwrap();
    assert_eq!(config.server.max_call_depth, 2);
    assert_eq!(config.telemetry.log, "debug");
}

#[test]
fn unknown_key_is_named() {
    let err = load_str(Some(("f.toml", "[server]\nlisten_addr = \"x\"\n")), &env(&[])).unwrap_err();
    let line = err.to_string();
    assert!(line.contains("f.toml") && line.contains("listen_addr"), "{line}");
    assert!(!line.contains('\n'));
}

#[test]
fn bad_listen_address_is_named() {
    let err =
        load_str(Some(("f.toml", "[server]\nlisten = \"nowhere\"\n")), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("server.listen"), "{err}");
}

#[test]
fn syntax_error_names_the_line() {
    let err = load_str(Some(("f.toml", "[server]\nlisten = \n")), &env(&[])).unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { line: 2, .. }), "{err:?}");
}

#[test]
fn globs_match_whole_names() {
    let name = crate::glob;
    assert!(name("*", "anything"));
    assert!(name("echo", "echo"));
    assert!(!name("echo", "echo2"));
    assert!(name("git*", "github_search"));
    assert!(name("*search", "github_search"));
    assert!(name("g*_*h", "github_search"));
    assert!(!name("g*_*x", "github_search"));
    assert!(!name("ab*ba", "aba"));
    assert!(name("*ab*b", "abb"));
    assert!(!name("a*b*b", "ab"));
    assert!(name("a**b", "ab"));
    assert!(name("*", ""));
    assert!(!name("a*", ""));
    assert!(name("*delete*", "file_delete_all"));
    assert!(name("x*y*z", "xyz"));
    assert!(!name("x*y*z", "xz"));
}

#[test]
fn a_log_filter_that_would_silence_the_logs_is_refused() {
    for good in
        ["info", "WARN,toolmesh=debug", "info,rmcp::transport::worker=off", "a[s{f=1}]=trace"]
    {
        let file = format!("[telemetry]\nlog = \"{good}\"\n");
        load_str(Some(("f.toml", &file)), &env(&[])).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    for bad in ["inof", "info,toolmesh=verbose", "=debug"] {
        let file = format!("[telemetry]\nlog = \"{bad}\"\n");
        let err = load_str(Some(("f.toml", &file)), &env(&[])).unwrap_err().to_string();
        assert!(err.contains("telemetry.log"), "{bad}: {err}");
    }
}

#[test]
fn the_log_format_is_text_json_or_refused() {
    let format = |file: &str, vars: &[(&str, &str)]| {
        load_str(Some(("f.toml", file)), &env(vars)).map(|config| config.telemetry.log_format)
    };
    assert_eq!(format("", &[]).unwrap(), crate::LogFormat::Text);
    assert_eq!(
        format("[telemetry]\nlog_format = \"json\"\n", &[]).unwrap(),
        crate::LogFormat::Json
    );
    let from_env = format("", &[("TOOLMESH__TELEMETRY__LOG_FORMAT", "json")]);
    assert_eq!(from_env.unwrap(), crate::LogFormat::Json);
    let err = format("[telemetry]\nlog_format = \"logfmt\"\n", &[]).unwrap_err().to_string();
    assert!(err.contains("telemetry.log_format") && err.contains("logfmt"), "{err}");
}

#[test]
fn the_variables_a_file_reads_and_the_environment_lacks_are_named() {
    let file = r#"
# ${IN_A_COMMENT} is no reference
[[tools.http]]
name = "weather"
url = "https://weather.example/{{city}}"
headers = { Authorization = "Bearer ${WEATHER_TOKEN}", "X-Team" = "${TEAM}-${WEATHER_TOKEN}" }

[credentials.github]
principals.alice = { env = "ALICE_GITHUB_TOKEN" }
default = { env = "SHARED_GITHUB_TOKEN" }

[[auth.api_keys]]
principal = "workers"
key_env = "WORKER_KEY"

[[auth.jwt]]
issuer = "https://idp.example/"
secret_env = "JWT_SECRET"

[vector]
api_key_env = "NOT_A_SECRET_TOOLMESH_NEEDS"
"#;
    let unset = crate::values::unset_variables(file, &env(&[("TEAM", "search")]));
    assert_eq!(
        unset,
        ["ALICE_GITHUB_TOKEN", "JWT_SECRET", "SHARED_GITHUB_TOKEN", "WEATHER_TOKEN", "WORKER_KEY"]
    );
}

/// A section a crate defines, as the tests define one.
#[derive(Debug, PartialEq)]
struct Fleet {
    pool: String,
    workers: u32,
}

impl Section for Fleet {
    const NAME: &'static str = "fleet";
    const DEFAULTS: &'static str = "# The fleet.\n[fleet]\npool = \"cpu\"\nworkers = 1\n";

    fn read(value: toml::Value, cx: &Reading<'_>) -> Result<Self, ConfigError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            pool: String,
            workers: u32,
        }
        let raw: Raw = cx.deserialize(value)?;
        if raw.workers == 0 {
            return Err(cx.key_error("fleet.workers", "must be greater than 0"));
        }
        Ok(Fleet { pool: raw.pool, workers: raw.workers })
    }
}

#[test]
fn a_crates_section_is_read_over_its_defaults_with_keys_named() {
    let config = load_str(None, &env(&[])).unwrap();
    assert_eq!(config.get::<Fleet>().unwrap(), Fleet { pool: "cpu".into(), workers: 1 });
    assert_eq!(config.find::<Fleet>().unwrap(), None, "not written");

    let file = "[fleet]\npool = \"gpu\"\n";
    let config =
        load_str(Some(("f.toml", file)), &env(&[("TOOLMESH__FLEET__WORKERS", "3")])).unwrap();
    assert_eq!(
        config.find::<Fleet>().unwrap(),
        Some(Fleet { pool: "gpu".into(), workers: 3 }),
        "layered like the core sections"
    );
    assert!(config.check_sections(&["fleet"]).is_ok());
    assert!(SectionDef::of::<Fleet>().check(&config).is_ok());

    let unclaimed = config.check_sections(&[]).unwrap_err().to_string();
    assert!(unclaimed.contains("f.toml") && unclaimed.contains("fleet"), "{unclaimed}");
    assert!(unclaimed.contains("unknown section"), "{unclaimed}");

    let read = |text: &str| {
        let config = load_str(Some(("f.toml", text)), &env(&[])).unwrap();
        SectionDef::of::<Fleet>().check(&config).unwrap_err().to_string()
    };
    let typo = read("[fleet]\npool = \"a\"\nworkrs = 1\n");
    assert!(typo.contains("f.toml") && typo.contains("fleet") && typo.contains("workrs"), "{typo}");
    assert!(!typo.contains('\n'));
    let zero = read("[fleet]\nworkers = 0\n");
    assert!(zero.contains("f.toml") && zero.contains("fleet.workers"), "{zero}");
    let not_a_table = read("fleet = 3\n");
    assert!(not_a_table.contains("fleet"), "{not_a_table}");
}

#[test]
fn a_program_sets_a_key_of_a_crates_section_as_the_file_would() {
    let mut config = load_str(Some(("f.toml", "[fleet]\nworkers = 2\n")), &env(&[])).unwrap();
    let before = config.clone();
    config.set("fleet.pool", "gpu");
    assert_eq!(config.get::<Fleet>().unwrap(), Fleet { pool: "gpu".into(), workers: 2 });
    assert!(!config.same_section(&before, "fleet"));
    assert!(config.same_section(&before, "other"));
}

#[test]
fn the_defaults_text_holds_the_core_and_every_section_given() {
    let text = defaults_text(&[SectionDef::of::<Fleet>()]);
    assert!(text.starts_with(DEFAULT_CONFIG.trim_end()));
    assert!(text.contains("[server]") && text.contains("[telemetry]") && text.contains("[fleet]"));
    let written = load_str(Some(("defaults", &text)), &env(&[])).expect("the text loads");
    let defaults = load_str(None, &env(&[])).unwrap();
    assert_eq!((&written.server, &written.telemetry), (&defaults.server, &defaults.telemetry));
    assert_eq!(written.get::<Fleet>().unwrap(), defaults.get::<Fleet>().unwrap());
}

#[test]
fn a_misspelt_section_is_refused_naming_the_known_ones() {
    let config = load_str(Some(("f.toml", "[serch]\nembeddings = false\n")), &env(&[])).unwrap();
    let err = config.check_sections(&["search"]).unwrap_err().to_string();
    assert!(err.contains("serch") && err.contains("search"), "names it and the known: {err}");
}
