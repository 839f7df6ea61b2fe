from cxlkv.cli import main

main()
