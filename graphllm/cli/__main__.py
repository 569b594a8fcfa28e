from graphllm.cli.main import main

main()
