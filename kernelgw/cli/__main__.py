from kernelgw.cli.main import main

main()
