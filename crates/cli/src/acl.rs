//! `deadbolt acl ...`: turn access control on, make and revoke tokens, and
//! say which identity may do what (docs/security.md has a walkthrough).
//!
//! Why every command is a thin call: the rules live in the replicated table
//! and the server checks every change (names, limits, the root role), so
//! the CLI only moves words and prints answers, as a table or `--json`.

use crate::exit;
use crate::Endpoints;
use deadbolt_client::{AclGrant, AclTokenResponse, Client, Error};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum AclCommand {
    /// Turn access control on and print the first token, for identity
    /// `root` (every permission). Works once; from then on every call needs
    /// a token or a client certificate, and is refused unless granted.
    Bootstrap {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Who this client is to the server, and what it may do.
    Whoami {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Roles, identities and token ids (needs admin).
    Show {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make or revoke tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Create, replace or delete roles.
    #[command(subcommand)]
    Role(RoleCommand),
    /// Give IDENTITY a role. An identity is a token's name or a client
    /// certificate's common name.
    Grant { identity: String, role: String },
    /// Take a role from IDENTITY.
    Revoke { identity: String, role: String },
    /// Refuse IDENTITY whatever it presents: its tokens, and a client
    /// certificate with its name that the CA still vouches for. Open
    /// connections are refused at their next call, open watches at their
    /// next event. Needs cluster version 4.
    Deny { identity: String },
    /// Take IDENTITY off the deny list.
    Allow { identity: String },
}

#[derive(clap::Subcommand)]
pub enum TokenCommand {
    /// A new token for IDENTITY, printed once (the server keeps only a
    /// hash): give it to that client as DEADBOLT_ACCESS_TOKEN.
    Create {
        identity: String,
        /// Stop the token working this long after the server makes it
        /// (`30d`, `12h`; by the servers' wall clocks). Without it, the
        /// token works until revoked. Needs cluster version 4.
        #[arg(long, value_parser = crate::parse_duration)]
        ttl: Option<Duration>,
        /// Print JSON instead of the bare token.
        #[arg(long)]
        json: bool,
    },
    /// Stop TOKEN_ID (the id `acl show` lists, the middle of
    /// dbt.<id>.<secret>) from working, on every node.
    Revoke { token_id: String },
}

#[derive(clap::Subcommand)]
pub enum RoleCommand {
    /// Create role NAME with GRANTs, or replace its grants. A grant is
    /// PERMISSION or PERMISSION:PREFIX, the permissions being lock, read,
    /// store-read, store-write and admin: `lock:jobs/` allows sessions and
    /// locks named jobs/..., `read` status and history of every lock.
    Put {
        name: String,
        #[arg(required = true)]
        grants: Vec<String>,
    },
    /// Delete role NAME and take it from everyone.
    Delete { name: String },
}

pub async fn main(endpoints: &Endpoints, command: AclCommand) -> i32 {
    let client = match crate::locks::connect(endpoints).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match run(&client, command).await {
        Ok(()) => exit::OK,
        Err(err) => exit::report(&err),
    }
}

async fn run(client: &Client, command: AclCommand) -> Result<(), Error> {
    match command {
        AclCommand::Bootstrap { json } => {
            let token = client.acl_bootstrap().await?;
            print_token(&token, json, true);
        }
        AclCommand::Whoami { json } => {
            let me = client.acl_whoami().await?;
            if json {
                println!("{}", serde_json::to_string(&me).expect("serializable"));
            } else if !me.enabled {
                println!("access control is off: every caller may do everything");
            } else if me.identity.is_empty() {
                println!("anonymous: send a token (DEADBOLT_ACCESS_TOKEN) or a client certificate");
            } else {
                println!("{} (by {})", me.identity, me.authenticated_by);
                println!("grants: {}", grant_list(&me.grants));
            }
        }
        AclCommand::Show { json } => {
            let acl = client.acl_show().await?;
            if json {
                println!("{}", serde_json::to_string(&acl).expect("serializable"));
                return Ok(());
            }
            println!("access control: {}", if acl.enabled { "on" } else { "off" });
            println!("\nROLE  GRANTS");
            for role in &acl.roles {
                println!("{}  {}", role.name, grant_list(&role.grants));
            }
            println!("\nIDENTITY  ROLES");
            for identity in &acl.identities {
                println!("{}  {}", identity.name, identity.roles.join(" "));
            }
            println!("\nTOKEN ID  IDENTITY  EXPIRES");
            for token in &acl.tokens {
                let expires = expiry(token.expires_unix_ms);
                println!("{}  {}  {expires}", token.token_id, token.identity);
            }
            if !acl.denied.is_empty() {
                println!("\nDENIED");
                for identity in &acl.denied {
                    println!("{identity}");
                }
            }
        }
        AclCommand::Token(TokenCommand::Create {
            identity,
            ttl,
            json,
        }) => {
            let token = match ttl {
                Some(ttl) => client.acl_create_expiring_token(&identity, ttl).await?,
                None => client.acl_create_token(&identity).await?,
            };
            print_token(&token, json, false);
        }
        AclCommand::Token(TokenCommand::Revoke { token_id }) => {
            client.acl_revoke_token(&token_id).await?;
            println!("revoked token {token_id}");
        }
        AclCommand::Role(RoleCommand::Put { name, grants }) => {
            let grants = grants.iter().map(|text| parse_grant(text)).collect();
            client.acl_put_role(&name, grants).await?;
            println!("role {name} set");
        }
        AclCommand::Role(RoleCommand::Delete { name }) => {
            client.acl_delete_role(&name).await?;
            println!("role {name} deleted");
        }
        AclCommand::Grant { identity, role } => {
            client.acl_bind_role(&identity, &role, true).await?;
            println!("granted role {role} to {identity}");
        }
        AclCommand::Revoke { identity, role } => {
            client.acl_bind_role(&identity, &role, false).await?;
            println!("revoked role {role} from {identity}");
        }
        AclCommand::Deny { identity } => {
            client.acl_deny_identity(&identity, true).await?;
            println!("denied {identity}: refused from its next call on");
        }
        AclCommand::Allow { identity } => {
            client.acl_deny_identity(&identity, false).await?;
            println!("allowed {identity} again");
        }
    }
    Ok(())
}

/// When a token stops working, as a UTC date; "never" for 0.
fn expiry(expires_unix_ms: u64) -> String {
    if expires_unix_ms == 0 {
        return "never".to_owned();
    }
    let at = std::time::UNIX_EPOCH + Duration::from_millis(expires_unix_ms);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// `PERMISSION[:PREFIX]`; the server checks the permission's name.
fn parse_grant(text: &str) -> AclGrant {
    let (permission, prefix) = text.split_once(':').unwrap_or((text, ""));
    AclGrant {
        permission: permission.to_owned(),
        prefix: prefix.to_owned(),
    }
}

fn grant_list(grants: &[AclGrant]) -> String {
    let texts: Vec<String> = grants
        .iter()
        .map(|grant| match grant.prefix.as_str() {
            "" => grant.permission.clone(),
            prefix => format!("{}:{prefix}", grant.permission),
        })
        .collect();
    if texts.is_empty() {
        "(none)".to_owned()
    } else {
        texts.join(" ")
    }
}

/// The token on stdout (alone, so `$(deadbolt acl token create ci)` works),
/// and what it is on stderr.
fn print_token(token: &AclTokenResponse, json: bool, bootstrap: bool) {
    if json {
        println!("{}", serde_json::to_string(token).expect("serializable"));
        return;
    }
    println!("{}", token.token);
    let what = if bootstrap {
        "access control is on; this is the root token (every permission)"
    } else {
        "a new token"
    };
    let until = match token.expires_unix_ms {
        0 => String::new(),
        at => format!(", working until {}", expiry(at)),
    };
    eprintln!(
        "deadbolt: {what} for identity {}, id {}{until}. It is shown only now: keep it \
         secret, and give it to the client as DEADBOLT_ACCESS_TOKEN",
        token.identity, token.token_id
    );
}
