#!/bin/bash
printf '#!/bin/bash\necho "Hello, world"\n' > /app/greet.sh
