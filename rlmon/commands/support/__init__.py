"""What several subcommands share that is not a command itself."""
