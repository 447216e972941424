//! `actorcile why`: one object's live state, read from a running operator's introspection
//! address ([`actorcile::introspect`]) and printed as a tree.

use std::net::SocketAddr;
use std::time::Duration;

use actorcile::introspect::ObjectReport;
use anyhow::{Context as _, bail};
use http_body_util::{BodyExt, Empty};

/// How long the request may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of an answer read (a report is a few KiB).
const MAX_ANSWER: usize = 1 << 20;

#[derive(clap::Args, Debug)]
pub struct WhyArgs {
    /// The operator's introspection address (its `--introspection-addr`; from outside the
    /// cluster, through `kubectl port-forward`)
    #[arg(long, default_value = "127.0.0.1:8081")]
    addr: SocketAddr,
    /// The object's kind, e.g. `Cluster`
    kind: String,
    /// `namespace/name`, or `name` for a cluster-scoped kind
    object: String,
    /// Print the report as the operator served it (JSON) instead of the tree
    #[arg(long)]
    json: bool,
}

pub fn run(args: WhyArgs) -> anyhow::Result<()> {
    print!("{}", answer(&args)?);
    Ok(())
}

/// What `run` prints: the tree, or the JSON with `--json`.
fn answer(args: &WhyArgs) -> anyhow::Result<String> {
    let path = format!("/objects/{}/{}", args.kind, args.object);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (status, body) = runtime
        .block_on(async { tokio::time::timeout(TIMEOUT, get(args.addr, &path)).await })
        .with_context(|| format!("{} did not answer within {TIMEOUT:?}", args.addr))??;
    let text = String::from_utf8_lossy(&body);
    if status != 200 {
        bail!("{} answered {status}: {}", args.addr, text.trim());
    }
    if args.json {
        return Ok(format!("{text}\n"));
    }
    let report: ObjectReport = serde_json::from_slice(&body)
        .with_context(|| format!("{} answered something other than a report", args.addr))?;
    Ok(report.tree())
}

/// `GET path` on `addr`: the status and the body (at most [`MAX_ANSWER`] bytes).
async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let req = http::Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<bytes::Bytes>::new())?;
    let res = sender.send_request(req).await?;
    let status = res.status().as_u16();
    let limited = http_body_util::Limited::new(res.into_body(), MAX_ANSWER);
    let body = limited
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
        .to_bytes();
    Ok((status, body.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        why: WhyArgs,
    }

    #[test]
    fn the_object_is_namespace_slash_name_and_the_address_defaults_to_loopback() {
        let cli = Cli::try_parse_from(["why", "Cluster", "team-a/web"]).unwrap();
        assert_eq!(cli.why.addr, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(
            (cli.why.kind.as_str(), cli.why.object.as_str()),
            ("Cluster", "team-a/web")
        );
        assert!(!cli.why.json);
    }

    #[test]
    fn nothing_listening_is_a_clear_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let args = WhyArgs {
            addr,
            kind: "Cluster".into(),
            object: "team-a/web".into(),
            json: false,
        };
        let e = answer(&args).unwrap_err();
        assert!(format!("{e:#}").contains("connecting to"), "{e:#}");
    }

    #[test]
    fn an_object_the_operator_does_not_have_is_its_answer() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let server = runtime
            .block_on(actorcile::admin::AdminServer::bind_introspection(
                "127.0.0.1:0".parse().unwrap(),
                actorcile::introspect::Introspection::new(),
                Default::default(),
            ))
            .unwrap();
        let args = WhyArgs {
            addr: server.local_addr(),
            kind: "Cluster".into(),
            object: "team-a/web".into(),
            json: false,
        };
        let e = answer(&args).unwrap_err();
        assert!(
            format!("{e:#}").contains("answered 404: no Cluster team-a/web here"),
            "{e:#}"
        );
        drop(server);
    }
}
