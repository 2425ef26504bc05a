#!/bin/bash
echo 9 > /app/count.txt
