"""One module per `gembench` subcommand: ``configure(parser)`` adds its flags, ``main(args)`` runs it."""
