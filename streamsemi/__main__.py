from streamsemi.cli import main

raise SystemExit(main())
