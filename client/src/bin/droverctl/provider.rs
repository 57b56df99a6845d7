//! `droverctl provider`: the providers a replica reaches.

use crate::output::{Output, Table};
use crate::send;
use drover_client::{v1, Client, ClientError};

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
    if output.messages(&providers, true) {
        return Ok(());
    }
    if output == Output::Name {
        providers.iter().for_each(|p| outln!("{}", p.name));
        return Ok(());
    }
    let mut table = Table::new([
        "NAME",
        "ENDPOINT",
        "DEFAULT",
        "LINK",
        "KIND",
        "CAPABILITIES",
    ]);
    for p in &providers {
        let (kind, summary) = match &p.capabilities {
            Some(c) => (c.kind.clone(), summary(c)),
            None => ("-".to_string(), p.error.clone()),
        };
        table.row([
            p.name.clone(),
            p.endpoint.clone(),
            (if p.is_default { "yes" } else { "" }).to_string(),
            link(p),
            kind,
            summary,
        ]);
    }
    table.print();
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
        "versions {}; offerings {}; control {}-{}; workers {}-{}; tasks {}; upgrade {}; unhealthy workers {}",
        any(&c.versions),
        any(&c.offerings),
        c.min_control_nodes,
        c.max_control_nodes,
        c.min_worker_nodes,
        c.max_worker_nodes,
        any(&c.task_types),
        c.upgrade_order,
        if c.replace_workers {
            "replaced or repaired"
        } else {
            "repaired"
        }
    )
}
