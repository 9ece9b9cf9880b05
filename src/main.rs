use clap::Parser;
use jointspace::{
    app::Application,
    cli,
    config::{BundleCommand, Cli, Command},
};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,ort=warn"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if args.log_json {
        fmt.json().init();
    } else {
        fmt.init();
    }
    match args.command {
        Command::Serve(cfg) => Application::build(cfg).await?.run_until_stopped().await?,
        Command::Ingest(a) => cli::ingest(a).await?,
        Command::Eval(a) => cli::eval(a).await?,
        Command::Bundle {
            command:
                BundleCommand::Inspect {
                    dir,
                    graphs,
                    runtime,
                },
        } => cli::inspect(dir, graphs, runtime)?,
        Command::Reindex(a) => cli::reindex(a).await?,
        Command::Export(a) => cli::export(a).await?,
        Command::Import(a) => cli::import(a).await?,
        Command::Sync(a) => cli::sync(a).await?,
    }
    // The command's pipeline is dropped by now: let its inference workers end (and free their sessions)
    // before the process's exit tears the runtime's libraries down.
    if !jointspace::batch::wait_for_workers(std::time::Duration::from_secs(5)) {
        tracing::warn!("inference workers still running after 5 s; exiting anyway");
    }
    Ok(())
}
