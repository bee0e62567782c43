from kernelgw.cli import main

main()
