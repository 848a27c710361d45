use std::{collections::BTreeMap, sync::Arc, time::Duration};

use serde_json::json;
use toolmesh_core::{Principal, PrincipalKind, SourceKind, ToolSource, ToolSpec};

use crate::{
    ApprovalMismatch, AuditEvent, Decision, LimitError, Policy, PolicyConfig, PolicyError,
    ResultLimit,
};

fn policy(toml_text: &str) -> Arc<Policy> {
    Arc::new(Policy::new(parse(toml_text)).expect("the policy compiles"))
}

fn parse(toml_text: &str) -> PolicyConfig {
    let mut config: PolicyConfig = toml::from_str(toml_text).expect("the policy parses");
    config.audit.to = "off".into();
    config
}

fn who(name: &str, roles: &[&str], agent: Option<&str>) -> Arc<Principal> {
    let mut attributes = BTreeMap::new();
    if let Some(agent) = agent {
        attributes.insert("agent".to_owned(), agent.to_owned());
    }
    Arc::new(Principal {
        name: name.into(),
        kind: PrincipalKind::ApiKey,
        issuer: None,
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        attributes,
        credential: None,
    })
}

fn tool(name: &str) -> ToolSpec {
    ToolSpec::new(name, "", json!({"type": "object"}), ToolSource::local("builtin"))
}

fn mcp_tool(name: &str, server: &str) -> ToolSpec {
    ToolSpec::new(
        name,
        "",
        json!({"type": "object"}),
        ToolSource { kind: SourceKind::Mcp, name: server.into() },
    )
}

const ADMINS_DELETE: &str = r#"
    [[rules]]
    name = "only-admins-delete"
    effect = "deny"
    tools = ["*delete*"]
    when = '!("admin" in principal.roles)'
"#;

#[test]
fn without_a_policy_everything_is_allowed() {
    let open = Arc::new(Policy::open());
    let scope = open.scope(who("a", &[], None));
    assert!(scope.sees(&tool("delete_all")));
    assert_eq!(scope.decide(&tool("x"), &json!({})).as_str(), "allow");
}

#[test]
fn a_deny_rule_on_the_principal_hides_the_tool_from_it_alone() {
    let policy = policy(ADMINS_DELETE);
    let user = policy.scope(who("u", &["dev"], None));
    let admin = policy.scope(who("a", &["admin"], None));
    assert!(!user.sees(&tool("file_delete")));
    assert!(user.sees(&tool("file_read")));
    assert!(admin.sees(&tool("file_delete")));
    assert_eq!(
        user.decide(&tool("file_delete"), &json!({})),
        Decision::Hidden { rule: "only-admins-delete".into() }
    );
    assert_eq!(admin.decide(&tool("file_delete"), &json!({})).as_str(), "allow");
}

#[test]
fn deny_wins_over_allow_and_the_default_deny_hides_the_rest() {
    let policy = policy(
        r#"
        default = "deny"
        [[rules]]
        name = "github"
        effect = "allow"
        tools = ["source:github"]
        [[rules]]
        name = "no-merges"
        effect = "deny"
        tools = ["*merge*"]
        roles = ["intern"]
        "#,
    );
    let intern = policy.scope(who("i", &["intern"], None));
    let dev = policy.scope(who("d", &["dev"], None));
    assert!(intern.sees(&mcp_tool("create_issue", "github")));
    assert!(!intern.sees(&mcp_tool("merge_pr", "github")));
    assert!(dev.sees(&mcp_tool("merge_pr", "github")));
    assert!(!dev.sees(&tool("echo")), "no rule allows it, and the default denies");
    assert_eq!(dev.decide(&tool("echo"), &json!({})), Decision::Hidden { rule: "default".into() });
    assert_eq!(
        dev.decide(&mcp_tool("merge_pr", "github"), &json!({})),
        Decision::Allow { rule: "github".into() }
    );
}

#[test]
fn a_rule_on_the_arguments_refuses_the_call_but_not_the_listing() {
    let policy = policy(
        r#"
        [[rules]]
        name = "under-tmp"
        effect = "deny"
        tools = ["write_file"]
        when = '!args.path.startsWith("/tmp/")'
        reason = "files are written under /tmp/ only"
        "#,
    );
    let scope = policy.scope(who("u", &[], None));
    assert!(scope.sees(&tool("write_file")));
    assert_eq!(scope.decide(&tool("write_file"), &json!({"path": "/tmp/a"})).as_str(), "allow");
    assert_eq!(
        scope.decide(&tool("write_file"), &json!({"path": "/etc/passwd"})),
        Decision::Refused {
            rule: "under-tmp".into(),
            reason: "files are written under /tmp/ only".into()
        }
    );
    // The condition cannot be evaluated without `path`: a deny rule then refuses.
    match scope.decide(&tool("write_file"), &json!({})) {
        Decision::Refused { rule, reason } => {
            assert_eq!(&*rule, "under-tmp");
            assert!(reason.contains("could not be evaluated"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_allow_rule_on_the_arguments_lists_the_tool_and_allows_only_matching_calls() {
    let policy = policy(
        r#"
        default = "deny"
        [[rules]]
        name = "small-transfers"
        effect = "allow"
        tools = ["transfer"]
        when = 'args.amount <= 100'
        "#,
    );
    let scope = policy.scope(who("u", &[], None));
    assert!(scope.sees(&tool("transfer")));
    assert_eq!(scope.decide(&tool("transfer"), &json!({"amount": 5})).as_str(), "allow");
    assert_eq!(scope.decide(&tool("transfer"), &json!({"amount": 500})).as_str(), "deny");
}

#[test]
fn rules_select_by_principal_agent_kind_toolkit_and_tag() {
    let policy = policy(
        r#"
        [[rules]]
        name = "bots-no-mcp"
        effect = "deny"
        principals = ["bot-*"]
        tools = ["kind:mcp"]
        [[rules]]
        name = "no-billing-for-support"
        effect = "deny"
        agents = ["support"]
        tools = ["toolkit:billing", "tag:money"]
        "#,
    );
    let bot = policy.scope(who("bot-7", &[], None));
    assert!(!bot.sees(&mcp_tool("x", "any")));
    assert!(bot.sees(&tool("x")));
    let support = policy.scope(who("s", &[], Some("support")));
    let mut billing = tool("refund");
    billing.toolkit = Some("billing".into());
    let mut tagged = tool("charge");
    tagged.tags = vec!["money".into()];
    assert!(!support.sees(&billing));
    assert!(!support.sees(&tagged));
    assert!(support.sees(&tool("lookup")));
    assert!(policy.scope(who("s", &[], Some("sales"))).sees(&billing));
}

/// The principal of a token whose subject is `alice`, from `issuer`.
fn token_of(name: &str, issuer: &str) -> Arc<Principal> {
    Arc::new(Principal {
        kind: PrincipalKind::Jwt,
        issuer: Some(issuer.into()),
        ..(*who(name, &[], None)).clone()
    })
}

/// A token's subject, a key and a certificate of one name are three principals: rules,
/// bindings and limits can name the kind and the issuer, limits and approvals are kept
/// for each apart, and the condition reads `principal.issuer`.
#[test]
fn principals_of_one_name_are_told_apart_by_kind_and_issuer() {
    let policy = policy(
        r#"
        [[rules]]
        name = "partner-tokens-read-only"
        effect = "deny"
        issuers = ["https://partner.*"]
        tools = ["write"]
        [[rules]]
        name = "no-certificates-on-admin"
        effect = "deny"
        principal_kinds = ["certificate"]
        tools = ["admin"]
        [[rules]]
        name = "idp-tokens-no-export"
        effect = "deny"
        tools = ["export"]
        when = 'principal.issuer == "https://idp.example"'
        [[profiles]]
        profile = "tokens"
        principal_kinds = ["jwt"]
        [[limits.principals]]
        principals = ["limited"]
        max_concurrent = 1
        "#,
    );
    let key = who("alice", &[], None);
    let partner = token_of("alice", "https://partner.example");
    let idp = token_of("alice", "https://idp.example");
    let certificate = Arc::new(Principal {
        kind: PrincipalKind::Certificate,
        ..(*who("alice", &[], None)).clone()
    });
    assert!(policy.scope(key.clone()).sees(&tool("write")));
    assert!(!policy.scope(partner.clone()).sees(&tool("write")));
    assert!(policy.scope(idp.clone()).sees(&tool("write")));
    assert!(policy.scope(key.clone()).sees(&tool("admin")));
    assert!(!policy.scope(certificate.clone()).sees(&tool("admin")));
    assert!(!policy.scope(idp.clone()).sees(&tool("export")));
    assert!(policy.scope(partner.clone()).sees(&tool("export")));
    assert_eq!(policy.bound_profile(&idp), Some("tokens"));
    assert_eq!(policy.bound_profile(&key), None);

    // One slot each: the key named `limited` and a token whose subject is `limited`.
    let limited_key = policy.scope(who("limited", &[], None));
    let limited_token = policy.scope(token_of("limited", "https://idp.example"));
    let _key_call = limited_key.admit(&tool("x")).unwrap();
    let _token_call = limited_token.admit(&tool("x")).expect("a slot of its own");
    assert!(limited_key.admit(&tool("x")).is_err(), "the key's one slot is taken");

    // An approval for the key is not one for the token or the certificate of that name.
    let approval = policy.approval(&key, "t", "{}", "r", "why", Duration::from_secs(60));
    assert_eq!(policy.check_approval(&approval.id, &key, "t", "{}"), Ok(()));
    for other in [&partner, &certificate] {
        assert_eq!(
            policy.check_approval(&approval.id, other, "t", "{}"),
            Err(ApprovalMismatch::OtherCall("principal"))
        );
    }
}

#[test]
fn an_unknown_principal_kind_is_refused_naming_its_key() {
    for (toml_text, key) in [
        (
            "[[rules]]\nname = \"a\"\neffect = \"deny\"\nprincipal_kinds = [\"key\"]",
            "rules[0].principal_kinds[0]",
        ),
        (
            "[[profiles]]\nprofile = \"p\"\nprincipal_kinds = [\"jwt\", \"token\"]",
            "profiles[0].principal_kinds[1]",
        ),
        (
            "[[limits.principals]]\nprincipal_kinds = [\"cert\"]\nmax_concurrent = 1",
            "limits.principals[0].principal_kinds[0]",
        ),
    ] {
        let error = Policy::new(parse(toml_text)).expect_err("refused").to_string();
        assert!(error.contains(key), "{error}");
        assert!(error.contains("api_key, jwt, certificate"), "{error}");
    }
}

#[test]
fn an_agent_list_limits_its_agent_to_its_tools() {
    let policy = policy(
        r#"
        [agents.support-bot]
        tools = ["toolkit:tickets", "search_docs"]
        "#,
    );
    let bot = policy.scope(who("k", &[], Some("support-bot")));
    let mut ticket = tool("open_ticket");
    ticket.toolkit = Some("tickets".into());
    assert!(bot.sees(&ticket));
    assert!(bot.sees(&tool("search_docs")));
    assert!(!bot.sees(&tool("delete_repo")));
    assert_eq!(
        bot.decide(&tool("delete_repo"), &json!({})),
        Decision::Hidden { rule: "agents.support-bot".into() }
    );
    // Another agent, or none, is not limited by it.
    assert!(policy.scope(who("k", &[], Some("other"))).sees(&tool("delete_repo")));
    assert!(policy.scope(who("k", &[], None)).sees(&tool("delete_repo")));
}

#[test]
fn conditions_read_the_tool_and_the_principal() {
    let policy = policy(
        r#"
        [[rules]]
        name = "read-only-for-guests"
        effect = "deny"
        roles = ["guest"]
        when = '!tool.annotations.read_only'
        [[rules]]
        name = "team-tools"
        effect = "deny"
        tools = ["tag:team-*"]
        when = '!tool.tags.exists(t, t == "team-" + principal.attributes.team)'
        "#,
    );
    let guest = policy.scope(who("g", &["guest"], None));
    let mut reader = tool("read");
    reader.annotations.read_only = Some(true);
    assert!(guest.sees(&reader));
    assert!(!guest.sees(&tool("write")));
    // Annotations of a source toolmesh does not trust count as unknown: a server cannot
    // claim its way past the rule.
    let mut claimed = mcp_tool("read", "stranger");
    claimed.annotations.read_only = Some(true);
    claimed.annotations_trusted = false;
    assert!(!guest.sees(&claimed));
    claimed.annotations_trusted = true;
    assert!(guest.sees(&claimed));

    let mut attributes = BTreeMap::new();
    attributes.insert("team".to_owned(), "blue".to_owned());
    let blue = policy.scope(Arc::new(Principal { attributes, ..(*who("b", &[], None)).clone() }));
    let mut blue_tool = tool("deploy_blue");
    blue_tool.tags = vec!["team-blue".into()];
    let mut red_tool = tool("deploy_red");
    red_tool.tags = vec!["team-red".into()];
    assert!(blue.sees(&blue_tool));
    assert!(!blue.sees(&red_tool));
    // Without the attribute the condition fails, and a deny rule then hides.
    assert!(!policy.scope(who("x", &[], None)).sees(&blue_tool));
}

#[test]
fn profiles_bind_to_the_first_matching_principal() {
    let policy = policy(
        r#"
        [[profiles]]
        profile = "support"
        agents = ["support-*"]
        [[profiles]]
        profile = "ops"
        roles = ["ops"]
        "#,
    );
    assert_eq!(policy.bound_profile(&who("a", &["ops"], Some("support-1"))), Some("support"));
    assert_eq!(policy.bound_profile(&who("a", &["ops"], None)), Some("ops"));
    assert_eq!(policy.bound_profile(&who("a", &[], None)), None);
}

#[test]
fn bad_rules_are_refused_naming_their_key() {
    let bad = |text: &str| match Policy::new(parse(text)) {
        Err(error) => error.to_string(),
        Ok(_) => panic!("accepted: {text}"),
    };
    let error = bad("[[rules]]\nname = \"a\"\neffect = \"deny\"\nwhen = \"principal.roles ==\"");
    assert!(error.starts_with("policy.rules[0].when: not a CEL expression"), "{error}");
    let error = bad("[[rules]]\nname = \"a\"\neffect = \"deny\"\nwhen = \"princpal.name == 'x'\"");
    assert!(error.contains("`princpal` is not known"), "{error}");
    let error = bad(
        "[[rules]]\nname = \"a\"\neffect = \"deny\"\n[[rules]]\nname = \"a\"\neffect = \"allow\"",
    );
    assert!(error.starts_with("policy.rules[1].name: another rule is named `a`"), "{error}");
    // A comprehension's own variable is not a mistake.
    let ok = "[[rules]]\nname = \"a\"\neffect = \"deny\"\nwhen = \"args.paths.all(p, p.startsWith('/tmp/'))\"";
    assert!(Policy::new(parse(ok)).is_ok());
    assert!(toml::from_str::<PolicyConfig>("[[rules]]\nname = \"a\"\neffect = \"maybe\"").is_err());
    assert!(
        toml::from_str::<PolicyConfig>(
            "[[rules]]\nname = \"a\"\neffect = \"deny\"\ntools = [\"shape:x\"]"
        )
        .is_err()
    );
}

#[test]
fn the_audit_log_appends_one_json_line_per_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let mut config = parse(ADMINS_DELETE);
    config.audit.to = path.display().to_string();
    let policy = Policy::new(config).unwrap();
    for decision in ["allow", "hide"] {
        policy.audit().record(&AuditEvent {
            event: "call",
            principal: "u",
            principal_kind: "api_key",
            issuer: None,
            agent: None,
            tool: "file_delete",
            call_id: "c1",
            decision,
            rule: "only-admins-delete",
            hidden: None,
            outcome: "ok",
            duration: Duration::from_micros(1500),
            at: std::time::Instant::now() - Duration::from_secs(2),
            trace_id: "",
            policy: policy.version(),
            note: None,
        });
    }
    assert!(policy.audit().flush(Duration::from_secs(5)));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["audit"]["decision"], "hide");
    assert_eq!(lines[0]["audit"]["rule"], "only-admins-delete");
    assert_eq!(lines[0]["audit"]["policy"], policy.version());
    // Stamped with the wall clock at the event: two seconds ago.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let ago = now.as_secs_f64() - lines[0]["ts"].as_f64().unwrap();
    assert!((1.9..5.0).contains(&ago), "{ago} s ago");
}

#[test]
fn an_audit_file_that_cannot_be_opened_is_an_error() {
    let mut config = parse("");
    config.audit.to = "/nonexistent-dir/audit.jsonl".into();
    assert!(matches!(Policy::new(config), Err(PolicyError::Audit { .. })));
}

#[test]
fn a_principal_bucket_refuses_past_its_burst_with_the_wait() {
    let policy = policy(
        r#"
        [[limits.principals]]
        principals = ["bob"]
        rate_per_s = 1.0
        burst = 2
        "#,
    );
    let bob = policy.scope(who("bob", &[], None));
    let alice = policy.scope(who("alice", &[], None));
    assert!(bob.admit(&tool("x")).is_ok());
    assert!(bob.admit(&tool("y")).is_ok());
    match bob.admit(&tool("x")) {
        Err(LimitError::Rate { subject, retry_after, rate }) => {
            assert_eq!(subject, "principal bob");
            assert_eq!(rate, "1/s, burst 2");
            assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(1));
        }
        other => panic!("{other:?}"),
    }
    // Another principal has no limit; each principal matching an entry has its own bucket.
    for _ in 0..10 {
        assert!(alice.admit(&tool("x")).is_ok());
    }
}

#[test]
fn a_tool_bucket_is_shared_by_every_caller() {
    let policy = policy(
        r#"
        [[limits.tools]]
        tools = ["expensive_*"]
        rate_per_s = 0.5
        burst = 1
        "#,
    );
    let a = policy.scope(who("a", &[], None));
    let b = policy.scope(who("b", &[], None));
    assert!(a.admit(&tool("expensive_report")).is_ok());
    let refused = b.admit(&tool("expensive_report")).unwrap_err();
    assert!(refused.to_string().contains("tool expensive_report"), "{refused}");
    assert!(b.admit(&tool("expensive_other")).is_ok(), "each tool has its own bucket");
    assert!(b.admit(&tool("cheap")).is_ok());
}

#[test]
fn concurrency_slots_are_given_back_when_the_permit_drops() {
    let policy = policy(
        r#"
        [[limits.principals]]
        roles = ["agent"]
        max_concurrent = 2
        "#,
    );
    let scope = policy.scope(who("bot", &["agent"], None));
    let first = scope.admit(&tool("x")).unwrap();
    let _second = scope.admit(&tool("x")).unwrap();
    assert_eq!(
        scope.admit(&tool("x")).unwrap_err(),
        LimitError::Concurrency { principal: "bot".into(), max: 2 }
    );
    drop(first);
    assert!(scope.admit(&tool("x")).is_ok());
    // Another principal of the role has slots of its own.
    let other = policy.scope(who("bot-2", &["agent"], None));
    let _a = other.admit(&tool("x")).unwrap();
    let _b = other.admit(&tool("x")).unwrap();
}

#[test]
fn a_tool_result_limit_replaces_the_default_one() {
    let policy = policy(
        r#"
        [limits]
        max_result_bytes = 1000
        max_argument_bytes = 10
        [[limits.tools]]
        tools = ["fetch_*"]
        max_result_bytes = 50
        truncate_result = true
        "#,
    );
    let scope = policy.scope(who("a", &[], None));
    assert_eq!(scope.max_argument_bytes(), Some(10));
    assert_eq!(
        scope.result_limit(&tool("fetch_page")),
        Some(ResultLimit { max_bytes: 50, truncate: true })
    );
    assert_eq!(
        scope.result_limit(&tool("other")),
        Some(ResultLimit { max_bytes: 1000, truncate: false })
    );
    assert_eq!(Arc::new(Policy::open()).scope(who("a", &[], None)).result_limit(&tool("x")), None);
}

#[test]
fn bad_limits_are_refused_naming_their_key() {
    let error = Policy::new(parse("[[limits.principals]]\nrate_per_s = 0.0")).unwrap_err();
    assert!(error.to_string().starts_with("policy.limits.principals[0].rate_per_s"), "{error}");
    let error =
        Policy::new(parse("[[limits.tools]]\ntools = [\"x\"]\nrate_per_s = 1.0\nburst = 0"))
            .unwrap_err();
    assert!(error.to_string().contains("burst must be at least 1"), "{error}");
}

#[test]
fn an_approve_rule_lists_the_tool_and_asks_at_the_call_while_deny_still_wins() {
    let policy = policy(
        r#"
        [[rules]]
        name = "big-transfers"
        effect = "approve"
        tools = ["transfer"]
        when = 'args.amount > 100'
        [[rules]]
        name = "no-interns"
        effect = "deny"
        roles = ["intern"]
        tools = ["transfer"]
        when = 'args.amount > 1000'
        "#,
    );
    let user = policy.scope(who("u", &[], None));
    assert!(user.sees(&tool("transfer")));
    assert_eq!(user.decide(&tool("transfer"), &json!({"amount": 5})).as_str(), "allow");
    assert_eq!(user.decide(&tool("transfer"), &json!({"amount": 500})).as_str(), "approve");
    let intern = policy.scope(who("i", &["intern"], None));
    assert_eq!(intern.decide(&tool("transfer"), &json!({"amount": 5000})).as_str(), "deny");
}

#[test]
fn an_approval_id_holds_for_its_own_call_only() {
    let policy = policy("");
    let bob = who("bob", &[], None);
    let approval =
        policy.approval(&bob, "t", r#"{"a": 1, "b": 2}"#, "r", "why", Duration::from_secs(60));
    // The same arguments written another way are the same call.
    assert_eq!(policy.check_approval(&approval.id, &bob, "t", r#"{"b":2,"a":1}"#), Ok(()));
    assert_eq!(
        policy.check_approval(&approval.id, &bob, "t", r#"{"a":1,"b":3}"#),
        Err(ApprovalMismatch::OtherCall("arguments"))
    );
    assert_eq!(
        policy.check_approval(&approval.id, &who("eve", &[], None), "t", r#"{"a":1,"b":2}"#),
        Err(ApprovalMismatch::OtherCall("principal"))
    );
    assert_eq!(
        policy.check_approval(&approval.id, &bob, "u", r#"{"a":1,"b":2}"#),
        Err(ApprovalMismatch::OtherCall("tool"))
    );
    let expired = policy.approval(&bob, "t", "{}", "r", "why", Duration::ZERO);
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(policy.check_approval(&expired.id, &bob, "t", "{}"), Err(ApprovalMismatch::Expired));
    // Another policy (another version, another key) does not know it.
    let other = self::policy("[[rules]]\nname = \"x\"\neffect = \"allow\"");
    assert_eq!(other.check_approval(&approval.id, &bob, "t", "{}"), Err(ApprovalMismatch::Forged));
}

/// Decisions are remembered per principal and tool without their arguments: a principal
/// of the same name with other roles, a tool republished with other tags, and other
/// arguments each get a decision of their own.
#[test]
fn remembered_plans_follow_the_principal_the_tool_and_the_arguments() {
    let policy = policy(
        r#"
        default = "deny"
        [[rules]]
        name = "admins-delete"
        effect = "allow"
        roles = ["admin"]
        tools = ["*delete*"]
        [[rules]]
        name = "tagged-safe"
        effect = "allow"
        tools = ["tag:safe"]
        [[rules]]
        name = "no-root"
        effect = "deny"
        tools = ["*"]
        when = 'has(args.path) && args.path.startsWith("/root")'
    "#,
    );
    let delete = tool("file_delete");
    for _ in 0..2 {
        assert!(policy.scope(who("kim", &["admin"], None)).sees(&delete));
        assert!(!policy.scope(who("kim", &["dev"], None)).sees(&delete), "other roles");
    }
    let untagged = tool("report");
    let mut tagged = tool("report");
    tagged.tags = vec!["safe".into()];
    let scope = policy.scope(who("lee", &[], None));
    for _ in 0..2 {
        assert!(!scope.sees(&untagged));
        assert!(scope.sees(&tagged), "the same name, republished with a tag");
    }
    for _ in 0..2 {
        assert_eq!(scope.decide(&tagged, &json!({"path": "/tmp/x"})).as_str(), "allow");
        assert_eq!(
            scope.decide(&tagged, &json!({"path": "/root/x"})),
            Decision::Refused {
                rule: "no-root".into(),
                reason: "the call's arguments are not allowed".into()
            }
        );
    }
}

#[test]
fn a_condition_that_gives_no_boolean_or_meets_arguments_that_are_no_object_fails_closed() {
    let policy = policy(
        r#"
        [[rules]]
        name = "not-a-test"
        effect = "deny"
        tools = ["count"]
        when = 'args.name + "!"'
        [[rules]]
        name = "under-tmp"
        effect = "deny"
        tools = ["write_file"]
        when = '!args.path.startsWith("/tmp/")'
        "#,
    );
    let scope = policy.scope(who("u", &[], None));
    match scope.decide(&tool("count"), &json!({"name": "a"})) {
        Decision::Refused { rule, reason } => {
            assert_eq!(&*rule, "not-a-test");
            assert!(reason.contains("not a boolean"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(scope.decide(&tool("write_file"), &json!({"path": "/tmp/a"})).as_str(), "allow");
    for arguments in [json!(["/tmp/a"]), json!("/tmp/a"), json!(null)] {
        assert_eq!(scope.decide(&tool("write_file"), &arguments).as_str(), "deny", "{arguments}");
    }
}
