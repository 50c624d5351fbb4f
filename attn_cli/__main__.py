from attn_cli.cli.app import main

main()
