//! `droverctl provider`: the providers a replica reaches.

use crate::{send, Output};
use drover_client::{v1, Client, ClientError};
use serde_json::{json, Value};

#[derive(clap::Subcommand)]
pub enum ProviderCommand {
    /// Each provider: name, endpoint, default, link security (TLS, client
    /// certificate, token) and what it says it supports. Replicas may be
    /// configured differently: this is the answering replica's view.
    List,
}

pub async fn run(
    client: &mut Client,
    output: Output,
    command: ProviderCommand,
) -> Result<(), ClientError> {
    match command {
        ProviderCommand::List => list(client, output).await,
    }
}

async fn list(client: &mut Client, output: Output) -> Result<(), ClientError> {
    let providers = send(client, v1::ListProvidersRequest {}, |mut c, r| async move {
        Ok(c.admin().list_providers(r).await?.into_inner().providers)
    })
    .await?;
    match output {
        Output::Json => {
            let list: Vec<Value> = providers.iter().map(provider_json).collect();
            outln!("{}", serde_json::to_string_pretty(&list).expect("json"));
        }
        Output::Table => {
            outln!(
                "{:<16} {:<30} {:<7} {:<16} {:<12} CAPABILITIES",
                "NAME",
                "ENDPOINT",
                "DEFAULT",
                "LINK",
                "KIND"
            );
            for p in &providers {
                let (kind, summary) = match &p.capabilities {
                    Some(c) => (c.kind.clone(), summary(c)),
                    None => ("-".to_string(), p.error.clone()),
                };
                outln!(
                    "{:<16} {:<30} {:<7} {:<16} {:<12} {}",
                    p.name,
                    p.endpoint,
                    if p.is_default { "yes" } else { "" },
                    link(p),
                    kind,
                    summary
                );
            }
        }
    }
    Ok(())
}

/// How the link is secured, in a few words: "plaintext", "tls",
/// "mtls+token" ...
fn link(p: &v1::ProviderInfo) -> String {
    let base = match (p.tls, p.client_certificate) {
        (false, _) => "plaintext",
        (true, false) => "tls",
        (true, true) => "mtls",
    };
    if p.bearer_token {
        format!("{base}+token")
    } else {
        base.to_string()
    }
}

fn summary(c: &v1::ProviderCapabilities) -> String {
    let any = |list: &[String]| {
        if list.is_empty() {
            "any".to_string()
        } else {
            list.join(",")
        }
    };
    format!(
        "versions {}; offerings {}; control {}-{}; workers {}-{}; tasks {}; upgrade {}",
        any(&c.versions),
        any(&c.offerings),
        c.min_control_nodes,
        c.max_control_nodes,
        c.min_worker_nodes,
        c.max_worker_nodes,
        any(&c.task_types),
        c.upgrade_order
    )
}

fn provider_json(p: &v1::ProviderInfo) -> Value {
    let capabilities = p.capabilities.as_ref().map(|c| {
        json!({
            "kind": c.kind,
            "versions": c.versions,
            "offerings": c.offerings,
            "min_control_nodes": c.min_control_nodes,
            "max_control_nodes": c.max_control_nodes,
            "min_worker_nodes": c.min_worker_nodes,
            "max_worker_nodes": c.max_worker_nodes,
            "task_types": c.task_types,
            "upgrade_order": c.upgrade_order,
        })
    });
    json!({
        "name": p.name,
        "endpoint": p.endpoint,
        "default": p.is_default,
        "tls": p.tls,
        "client_certificate": p.client_certificate,
        "bearer_token": p.bearer_token,
        "capabilities": capabilities,
        "error": (!p.error.is_empty()).then_some(&p.error),
    })
}
