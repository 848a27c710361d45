//! `toolmesh-bench --policy`: the cost of the tool policy on the call path. Two toolmesh
//! servers with the same ten API-key principals, one with a `[policy]` of fifty rules (49
//! over principal and tool globs, roles and agents, one CEL condition on the arguments of
//! the tool called, auditing every call to a file) and one without; the CallTool load of
//! the plain benchmark against both, each caller a principal of its own connection,
//! alternating rounds: throughput under a closed loop, then latency in an open loop at
//! half of the server without policy's maximum.
//!
//! On a small machine the speed of the whole machine drifts by more than the policy costs,
//! from one second to the next. So the two servers are compared round by round: each round
//! measures both back to back (which goes first alternates), and the figures reported are
//! the medians of the rounds' ratios and differences, with their range; the medians of each
//! server's own samples are shown beside them.

use std::time::Duration;

use anyhow::Context as _;
use toolmesh_proto::v1::{CallToolRequest, tool_service_client::ToolServiceClient};

use crate::load::{self, BenchOptions, Programs, RemoveOnDrop, Sample};

/// The principals, one connection each.
const PRINCIPALS: usize = 10;

/// What of the policy is measured: by default all of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Variant {
    /// The rule with a CEL condition on the arguments.
    pub(crate) cel: bool,
    /// The audit log, to a file.
    pub(crate) audit: bool,
    /// A control run: the second server has no policy either, so that what the benchmark
    /// reads is its own noise.
    pub(crate) control: bool,
}

/// With `--pin`, the cores of the load generator and of the servers: the first half of
/// the cores this process may run on, and the rest.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Cores {
    pub(crate) load: Vec<usize>,
    pub(crate) servers: Vec<usize>,
}

impl Cores {
    pub(crate) fn split() -> anyhow::Result<Self> {
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
        let cpus: Vec<usize> = (0..nix::sched::CpuSet::count())
            .filter(|&cpu| allowed.is_set(cpu).unwrap_or(false))
            .collect();
        anyhow::ensure!(
            cpus.len() >= 2,
            "--pin needs at least two cores; this process may run on {}",
            cpus.len()
        );
        let (load, servers) = cpus.split_at(cpus.len() / 2);
        Ok(Cores { load: load.to_vec(), servers: servers.to_vec() })
    }
}

/// Figures of `toolmesh-bench --policy`.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct PolicyReport {
    /// Rules of the policy.
    pub(crate) rules: usize,
    /// Whether every call was audited (to a file).
    pub(crate) audited: bool,
    /// A control run: neither server had a policy.
    pub(crate) control: bool,
    /// The cores of the load generator and of the servers, when pinned.
    pub(crate) pinned: Option<Cores>,
    /// Closed loop, without policy.
    pub(crate) open: Sample,
    /// Closed loop, with the policy.
    pub(crate) governed: Sample,
    /// Throughput with the policy over that without: the median of the rounds' ratios.
    pub(crate) throughput_ratio: f64,
    /// The lowest and highest of the rounds' throughput ratios.
    pub(crate) throughput_ratio_range: [f64; 2],
    /// The server's CPU time (user and system) per call in the closed loop, without and
    /// with the policy, in µs; where the system tells.
    pub(crate) cpu_us_per_call: Option<[f64; 2]>,
    /// The same at half load, where both servers take the same calls at the same rate: the
    /// policy's own cost, without the transport batching less at a lower rate.
    pub(crate) half_cpu_us_per_call: Option<[f64; 2]>,
    /// The open-loop rate: half of the maximum without policy.
    pub(crate) half_rate: f64,
    /// Half load, without policy.
    pub(crate) open_half: Sample,
    /// Half load, with the policy.
    pub(crate) governed_half: Sample,
    /// p99 at half load with the policy less that without, in ms: the median of the
    /// rounds' differences.
    pub(crate) p99_added_ms: f64,
    /// The lowest and highest of the rounds' p99 differences, in ms.
    pub(crate) p99_added_range_ms: [f64; 2],
    /// Rounds per phase.
    pub(crate) rounds: usize,
}

/// A server's CPU time over the calls it took; unknown once any part of it is.
#[derive(Debug, Clone, Copy)]
struct CpuPerCall(Option<(Duration, f64)>);

impl Default for CpuPerCall {
    fn default() -> Self {
        CpuPerCall(Some((Duration::ZERO, 0.0)))
    }
}

impl CpuPerCall {
    fn add(&mut self, used: Option<Duration>, calls: f64) {
        self.0 = self.0.zip(used).map(|((time, total), used)| (time + used, total + calls));
    }

    /// In µs.
    fn us_per_call(self) -> Option<f64> {
        self.0
            .filter(|&(_, calls)| calls > 0.0)
            .map(|(time, calls)| time.as_secs_f64() * 1e6 / calls)
    }
}

/// Measures both servers `rounds` times with `measure` (which takes `slice`), each round
/// both back to back, the governed one first in odd rounds so that a drift of the
/// machine's speed within a round favours neither; returns their samples and the CPU time
/// each used per call.
async fn phase<F, Fut>(
    rounds: usize,
    slice: Duration,
    servers: [&load::ChildServer; 2],
    measure: F,
) -> ([Vec<Sample>; 2], [Option<f64>; 2])
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Sample>,
{
    let mut samples: [Vec<Sample>; 2] = Default::default();
    let mut cpu = [CpuPerCall::default(); 2];
    for r in 0..rounds {
        let order = if r.is_multiple_of(2) { [0, 1] } else { [1, 0] };
        for i in order {
            let before = servers[i].cpu_time();
            let sample = measure(i).await;
            let used = before.zip(servers[i].cpu_time()).map(|(b, a)| a.saturating_sub(b));
            cpu[i].add(used, sample.throughput * slice.as_secs_f64());
            samples[i].push(sample);
        }
    }
    (samples, cpu.map(CpuPerCall::us_per_call))
}

/// The `[auth]` both servers share, and the keys of its principals.
fn auth() -> (String, Vec<String>) {
    let mut toml = String::new();
    let mut keys = Vec::new();
    for i in 0..PRINCIPALS {
        let key = toolmesh_identity::new_key();
        let admin = if i == 0 { ", \"admin\"" } else { "" };
        toml.push_str(&format!(
            "[[auth.api_keys]]\nprincipal = \"agent-{i}\"\nsha256 = \"{}\"\n\
             roles = [\"team-{}\"{admin}]\nattributes = {{ agent = \"bot-{}\" }}\n\n",
            toolmesh_identity::key_digest(&key),
            i % 3,
            i % 5,
        ));
        keys.push(key);
    }
    (toml, keys)
}

/// Fifty rules as a deployment writes them: most are about other tools and other
/// principals (so each call looks at all of them), a few match the tool called, and one CEL
/// condition on its arguments is evaluated at every call.
fn rules(audit: &std::path::Path, variant: Variant) -> (String, usize) {
    let to = if variant.audit { audit.display().to_string() } else { "off".into() };
    let mut toml = format!("[policy]\ndefault = \"deny\"\n\n[policy.audit]\nto = \"{to}\"\n\n");
    let mut count = 0;
    let mut rule = |toml: &mut String, body: String| {
        count += 1;
        toml.push_str(&format!("[[policy.rules]]\nname = \"rule-{count}\"\n{body}\n"));
    };
    for i in 0..12 {
        rule(
            &mut toml,
            format!("effect = \"deny\"\ntools = [\"github_*_{i}\", \"tag:danger-{i}\"]\n"),
        );
        rule(
            &mut toml,
            format!(
                "effect = \"allow\"\nroles = [\"team-{}\"]\ntools = [\"toolkit:kit-{i}\", \"source:mcp-{i}*\"]\n",
                i % 3
            ),
        );
        rule(
            &mut toml,
            format!("effect = \"deny\"\nprincipals = [\"intern-{i}*\"]\ntools = [\"*\"]\n"),
        );
        rule(
            &mut toml,
            format!(
                "effect = \"allow\"\nagents = [\"bot-{}\"]\ntools = [\"kind:remote\", \"report_{i}_*\"]\n",
                i % 5
            ),
        );
    }
    // 48 so far; the tool called is allowed by role, and its arguments checked in CEL.
    rule(&mut toml, "effect = \"allow\"\nroles = [\"team-0\", \"team-1\", \"team-2\"]\ntools = [\"echo\", \"think\", \"analyze\"]\n".into());
    if !variant.cel {
        return (toml, count);
    }
    rule(
        &mut toml,
        "effect = \"deny\"\ntools = [\"echo\"]\nwhen = 'size(args.message) > 4096 || args.message.startsWith(\"rm -rf\")'\n\
         reason = \"messages are short and harmless\"\n"
            .into(),
    );
    (toml, count)
}

/// Starts `toolmesh serve` with `config` (TOML) written to a temporary file, on `cpus` when
/// given.
async fn serve(
    programs: &Programs,
    name: &str,
    config: &str,
    cpus: Option<&[usize]>,
) -> anyhow::Result<(load::ChildServer, RemoveOnDrop)> {
    let path =
        std::env::temp_dir().join(format!("toolmesh-bench-{name}-{}.toml", std::process::id()));
    std::fs::write(&path, config)?;
    let arg = path.display().to_string();
    let child = load::start_child_on(
        &programs.toolmesh,
        &["serve", "--listen", "127.0.0.1:0", "--config", &arg],
        cpus,
    )
    .await?;
    Ok((child, RemoveOnDrop(path)))
}

/// One connection per principal.
async fn clients(
    addr: &str,
    keys: &[String],
) -> anyhow::Result<Vec<ToolServiceClient<toolmesh::client::Connection>>> {
    let mut clients = Vec::with_capacity(keys.len());
    for key in keys {
        clients.push(toolmesh::client::connect(addr, Some(key)).await?);
    }
    Ok(clients)
}

/// Runs the policy benchmark with `options`' load (concurrency, phases, rounds).
pub(crate) async fn run(
    options: &BenchOptions,
    programs: &Programs,
    variant: Variant,
    pinned: Option<Cores>,
) -> anyhow::Result<PolicyReport> {
    let (auth, keys) = auth();
    let audit = RemoveOnDrop(
        std::env::temp_dir().join(format!("toolmesh-bench-audit-{}.jsonl", std::process::id())),
    );
    let (rules, count) =
        if variant.control { (String::new(), 0) } else { rules(&audit.0, variant) };
    let on = pinned.as_ref().map(|cores| cores.servers.as_slice());
    let (open_server, _open_config) = serve(programs, "open", &auth, on).await?;
    let (governed_server, _governed_config) =
        serve(programs, "policy", &format!("{auth}\n{rules}"), on).await?;
    let request = CallToolRequest {
        name: options.tool.clone(),
        arguments_json: options.arguments.clone(),
        ..Default::default()
    };
    let targets = [
        clients(&open_server.addr.to_string(), &keys).await?,
        clients(&governed_server.addr.to_string(), &keys).await?,
    ];
    for clients in &targets {
        load::until_embedded(&clients[0]).await?;
    }
    for clients in &targets {
        for client in clients {
            let probe = client.clone().call_tool(request.clone()).await.context("probe call")?;
            anyhow::ensure!(!probe.get_ref().is_error, "probe call failed: {:?}", probe.get_ref());
        }
        load::closed_loop(clients, options.concurrency, options.warmup, &request).await;
    }
    let rounds = options.rounds.max(1);
    let slice = options.duration / rounds as u32;
    let servers = [&open_server, &governed_server];
    let request = &request;
    let (closed, closed_cpu) = phase(rounds, slice, servers, |i| {
        load::closed_loop(&targets[i], options.concurrency, slice, request)
    })
    .await;
    let (throughput_ratio, throughput_ratio_range) = load::median_and_range(
        closed[0].iter().zip(&closed[1]).map(|(o, g)| g.throughput / o.throughput).collect(),
    );
    let [open, governed] = closed.map(load::median);
    let half_rate = open.throughput / 2.0;
    let (half, half_cpu) =
        phase(rounds, slice, servers, |i| load::open_loop(&targets[i], half_rate, slice, request))
            .await;
    let (p99_added_ms, p99_added_range_ms) = load::median_and_range(
        half[0].iter().zip(&half[1]).map(|(o, g)| g.p99_ms - o.p99_ms).collect(),
    );
    let [open_half, governed_half] = half.map(load::median);
    let both = |[open, governed]: [Option<f64>; 2]| open.zip(governed).map(|(o, g)| [o, g]);
    Ok(PolicyReport {
        rules: count,
        audited: variant.audit && !variant.control,
        control: variant.control,
        pinned,
        throughput_ratio,
        throughput_ratio_range,
        cpu_us_per_call: both(closed_cpu),
        half_cpu_us_per_call: both(half_cpu),
        p99_added_ms,
        p99_added_range_ms,
        rounds,
        open,
        governed,
        half_rate,
        open_half,
        governed_half,
    })
}

/// The report as a table.
pub(crate) fn render(report: &PolicyReport) -> String {
    let row = |name: &str, s: &Sample| {
        format!(
            "{name:<28} {:>10.0} {:>9.3} {:>9.3} {:>9.3} {:>7}\n",
            s.throughput, s.p50_ms, s.p90_ms, s.p99_ms, s.errors
        )
    };
    let title = if report.control {
        format!("CallTool, control run: two servers without policy, {PRINCIPALS} principals")
    } else {
        format!(
            "CallTool with and without a policy of {} rules, {PRINCIPALS} principals, {}",
            report.rules,
            if report.audited { "every call audited" } else { "no audit" }
        )
    };
    let mut out = format!(
        "{title}\n{:<28} {:>10} {:>9} {:>9} {:>9} {:>7}\n",
        "", "calls/s", "p50 ms", "p90 ms", "p99 ms", "errors"
    );
    if let Some(Cores { load, servers }) = &report.pinned {
        out.push_str(&format!("load generator on cores {load:?}, servers on cores {servers:?}\n"));
    }
    out.push_str(&row("no policy, closed loop", &report.open));
    // The second server, and how its figures are read against the first's: in a control
    // run it has no policy either.
    let (second, with, on) = if report.control {
        ("control", "of the control", "on the control")
    } else {
        ("policy", "with policy", "with it")
    };
    out.push_str(&row(&format!("{second}, closed loop"), &report.governed));
    out.push_str(&row(&format!("no policy, {:.0}/s", report.half_rate), &report.open_half));
    out.push_str(&row(&format!("{second}, {:.0}/s", report.half_rate), &report.governed_half));
    let [low, high] = report.throughput_ratio_range;
    let [p99_low, p99_high] = report.p99_added_range_ms;
    out.push_str(&format!(
        "medians of {} paired rounds: throughput {with} {:.3}x (rounds {low:.3}-{high:.3}; goal >= 0.9), \
         p99 added at half load {:+.3} ms (rounds {p99_low:+.3} to {p99_high:+.3}; goal <= 0.1)\n",
        report.rounds,
        report.throughput_ratio,
        report.p99_added_ms
    ));
    for (phase, cpu) in
        [("closed loop", report.cpu_us_per_call), ("half load", report.half_cpu_us_per_call)]
    {
        if let Some([open, governed]) = cpu {
            out.push_str(&format!(
                "server CPU per call, {phase}: {open:.1} us without policy, {governed:.1} us {on} ({:.3}x)\n",
                governed / open
            ));
        }
    }
    if let Some(error) = report.open.first_error.as_ref().or(report.governed.first_error.as_ref()) {
        out.push_str(&format!("first error: {error}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_benchmark_policy_has_fifty_rules() {
        let all = super::Variant { cel: true, audit: true, control: false };
        let (_, count) = super::rules(std::path::Path::new("/tmp/audit.jsonl"), all);
        assert_eq!(count, 50);
        let lean = super::Variant { cel: false, audit: false, control: false };
        let (toml, count) = super::rules(std::path::Path::new("/tmp/audit.jsonl"), lean);
        assert_eq!(count, 49);
        assert!(toml.contains("to = \"off\"") && !toml.contains("when"), "{toml}");
    }

    #[test]
    fn a_control_run_is_reported_as_two_servers_without_policy() {
        let sample = |throughput: f64| crate::load::Sample {
            throughput,
            p50_ms: 0.2,
            p90_ms: 0.3,
            p99_ms: 0.6,
            errors: 0,
            first_error: None,
        };
        let mut report = super::PolicyReport {
            rules: 0,
            audited: false,
            control: true,
            pinned: None,
            open: sample(30_000.0),
            governed: sample(30_300.0),
            throughput_ratio: 1.01,
            throughput_ratio_range: [0.97, 1.05],
            cpu_us_per_call: Some([32.0, 31.5]),
            half_cpu_us_per_call: None,
            half_rate: 15_000.0,
            open_half: sample(15_000.0),
            governed_half: sample(15_000.0),
            p99_added_ms: -0.003,
            p99_added_range_ms: [-0.6, 0.5],
            rounds: 20,
        };
        let table = super::render(&report);
        assert!(table.starts_with("CallTool, control run: two servers without policy"), "{table}");
        assert!(table.contains("control, closed loop") && table.contains("control, 15000/s"));
        assert!(table.contains("throughput of the control 1.010x"), "{table}");
        assert!(table.contains("31.5 us on the control"), "{table}");
        assert!(!table.contains("with policy") && !table.contains("with it"), "{table}");
        report.control = false;
        report.rules = 50;
        report.audited = true;
        let table = super::render(&report);
        assert!(table.starts_with("CallTool with and without a policy of 50 rules"), "{table}");
        assert!(table.contains("policy, closed loop") && table.contains("with policy 1.010x"));
    }
}
